"""Chat templates for the tiny models.

Text Qwen3 uses the real template shipped with the tokenizer files. Qwen3-VL needs one that
also takes content lists: each image part becomes ``<|vision_start|><|image_pad|><|vision_end|>``
and each video part ``<|vision_start|><|video_pad|><|vision_end|>`` (one pad per item; the
processor expands it to the item's patch count). Tools, tool calls, tool responses and the
``<think>`` rules follow the Qwen3 template, so a text-only conversation renders to the same
string under both templates.
"""

from __future__ import annotations

QWEN3_VL_CHAT_TEMPLATE = r"""
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- elif part.type in ['image', 'image_url'] -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif part.type in ['video', 'video_url'] -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render_content(messages[0].content) + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- set text = render_content(message.content) %}
    {%- if ns.multi_step_tool and message.role == 'user' and not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set text = render_content(message.content) %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + text + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = text %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in text %}
            {%- set content = text.split('</think>')[-1].lstrip('\n') %}
            {%- set reasoning_content = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + text + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
""".strip()

# ChatML with Hermes-style tools, for imported models whose own template ignores ``tools``
# (SmolLM2's renders only role and content) or that ship none (Gemma-3 base). Tools are listed
# in the system turn as JSON; calls are written as ``<tool_call>{json}</tool_call>``, which the
# ``hermes`` parser reads; tool results come back in a user turn inside ``<tool_response>``.
CHATML_TOOLS_TEMPLATE = r"""
{%- set sys = messages[0].content if messages and messages[0].role == 'system' else '' %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if sys %}{{- sys + '\n\n' }}{%- endif %}
    {{- 'You can call functions. Their signatures, one JSON object per line, are inside <tools></tools>:\n<tools>' }}
    {%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
    {{- '\n</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments inside <tool_call></tool_call> tags, for example:\n<tool_call>\n{"name": "function_name", "arguments": {"arg": "value"}}\n</tool_call><|im_end|>\n' }}
{%- elif sys %}
    {{- '<|im_start|>system\n' + sys + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' + (message.content or '') }}
        {%- for call in (message.tool_calls or []) %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if (loop.first and message.content) or not loop.first %}{{- '\n' }}{%- endif %}
            {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
            {%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
""".strip()

# Gemma's turn markup (``<start_of_turn>user`` / ``model``, ``<end_of_turn>``) with the same tool
# prompt and Hermes ``<tool_call>`` format as chatml-tools. Gemma has no system role: the system
# text and the tool list open the first user turn; tool results come back as a user turn.
GEMMA_TOOLS_TEMPLATE = r"""
{{- bos_token }}
{%- set sys = messages[0].content if messages and messages[0].role == 'system' else '' %}
{%- set ns = namespace(prefix='') %}
{%- if tools %}
    {%- set ns.prefix = (sys + '

' if sys else '') + 'You can call functions. Their signatures, one JSON object per line, are inside <tools></tools>:
<tools>' %}
    {%- for tool in tools %}{%- set ns.prefix = ns.prefix + '
' + (tool | tojson) %}{%- endfor %}
    {%- set ns.prefix = ns.prefix + '
</tools>

To call a function, reply with a JSON object holding its name and arguments inside <tool_call></tool_call> tags, for example:
<tool_call>
{"name": "function_name", "arguments": {"arg": "value"}}
</tool_call>

' %}
{%- elif sys %}
    {%- set ns.prefix = sys + '

' %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' %}
        {{- '<start_of_turn>model
' + (message.content or '') }}
        {%- for call in (message.tool_calls or []) %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if (loop.first and message.content) or not loop.first %}{{- '
' }}{%- endif %}
            {{- '<tool_call>
{"name": "' + fn.name + '", "arguments": ' }}
            {%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}
            {{- '}
</tool_call>' }}
        {%- endfor %}
        {{- '<end_of_turn>
' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<start_of_turn>user' }}{%- endif %}
        {{- '
<tool_response>
' + message.content + '
</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<end_of_turn>
' }}{%- endif %}
    {%- else %}
        {{- '<start_of_turn>user
' + ns.prefix + message.content + '<end_of_turn>
' }}
        {%- set ns.prefix = '' %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<start_of_turn>model
' }}{%- endif %}
""".strip()

#: templates ``relax-gym models import --chat-template NAME`` knows by name
BUILTIN_TEMPLATES: dict[str, str] = {"chatml-tools": CHATML_TOOLS_TEMPLATE, "gemma-tools": GEMMA_TOOLS_TEMPLATE}

__all__ = ["BUILTIN_TEMPLATES", "CHATML_TOOLS_TEMPLATE", "GEMMA_TOOLS_TEMPLATE", "QWEN3_VL_CHAT_TEMPLATE"]
