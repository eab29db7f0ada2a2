"""Model outputs for the parser tests: well-formed and malformed, in the styles real Qwen
models produce (thinking blocks, several calls, JSON-string arguments, a template-opened
<think>). Each case: (id, text, expected calls as (name, arguments), expected errors in
order, each a fragment or a list of fragments of that error message)."""

from __future__ import annotations

from typing import Any

Case = tuple[str, str, list[tuple[str, dict[str, Any]]], list[Any]]

QWEN3_TWO_CALLS = """<think>
The user wants the weather in Paris and in Tokyo. I will call get_weather once per city, in
celsius. The API also takes a `days` argument; one day is enough.
</think>

I'll look up both cities.
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
</tool_call>
<tool_call>
{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "celsius"}}
</tool_call>"""

# Qwen3's chat template ends the prompt with "<think>\n", so the output starts inside it.
QWEN3_TEMPLATE_OPENED = """Okay, the image shows a chart; the legend is small. I should zoom into the top-right corner.
</think>

<tool_call>
{"name": "zoom", "arguments": {"image_id": "img_1", "bbox": [320, 0, 640, 120]}}
</tool_call>"""

QWEN3_CALL_ONLY_IN_THINKING = """<think>
Maybe I could call <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>
but 2 + 2 is easy: it is 4.
</think>

The answer is \\boxed{4}."""

QWEN3_TRUNCATED_THINKING = """<think>
Let me compute with the calculator: <tool_call>{"name": "calculator", "arguments": {"expression": "17*23"}}</tool_call> hmm, wait"""

QWEN25_ARGS_AS_STRING = """<tool_call>
{"name": "python", "arguments": "{\\"code\\": \\"import math\\\\nprint(math.factorial(20))\\"}"}
</tool_call>"""

QWEN3_VL_MIXED = """<think>
I need to read the sign. First zoom in, then search the menu for the dish name.
</think>
<tool_call>
{"name": "zoom", "arguments": {"image_id": "photo", "bbox": [10, 20, 110, 80], "factor": 3}}
</tool_call>
<tool_call>
{"name": "search", "arguments": {"query": "café crème brûlée prix", "k": 3}}
</tool_call>
<tool_call>
{"name": "calculator", "arguments": {"expression": "3 * 4.5"}}
</tool_call>"""

HERMES_CASES: list[Case] = [
    ("qwen3_two_calls", QWEN3_TWO_CALLS,
     [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_weather", {"city": "Tokyo", "unit": "celsius"})], []),
    ("qwen3_template_opened_think", QWEN3_TEMPLATE_OPENED,
     [("zoom", {"image_id": "img_1", "bbox": [320, 0, 640, 120]})], []),
    ("call_only_inside_thinking", QWEN3_CALL_ONLY_IN_THINKING, [], []),
    ("truncated_thinking", QWEN3_TRUNCATED_THINKING, [], []),
    ("arguments_as_json_string", QWEN25_ARGS_AS_STRING,
     [("python", {"code": "import math\nprint(math.factorial(20))"})], []),
    ("qwen3_vl_three_calls_unicode", QWEN3_VL_MIXED,
     [("zoom", {"image_id": "photo", "bbox": [10, 20, 110, 80], "factor": 3}),
      ("search", {"query": "café crème brûlée prix", "k": 3}),
      ("calculator", {"expression": "3 * 4.5"})], []),
    ("plain_answer", "The answer is 42.", [], []),
    ("no_arguments_key", '<tool_call>{"name": "finish"}</tool_call>', [("finish", {})], []),
    ("parameters_synonym", '<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>', [("f", {"x": 1})], []),
    ("null_arguments", '<tool_call>{"name": "f", "arguments": null}</tool_call>', [("f", {})], []),
    ("list_of_calls_in_one_block",
     '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": [1, {"z": null}]}}]</tool_call>',
     [("a", {}), ("b", {"y": [1, {"z": None}]})], []),
    ("code_fence_inside_tag", '<tool_call>\n```json\n{"name": "a", "arguments": {"q": 1}}\n```\n</tool_call>',
     [("a", {"q": 1})], []),
    ("name_is_trimmed", '<tool_call>{"name": " calculator ", "arguments": {"expression": "1"}}</tool_call>',
     [("calculator", {"expression": "1"})], []),
    ("newlines_and_tags_in_strings",
     '<tool_call>{"name": "python", "arguments": {"code": "s = \'</div>\'\\nprint(s)"}}</tool_call>',
     [("python", {"code": "s = '</div>'\nprint(s)"})], []),
    # ---- malformed ----------------------------------------------------------------------------
    ("trailing_comma", '<tool_call>{"name": "a", "arguments": {"x": 1,}}</tool_call>', [], ["malformed JSON"]),
    ("python_dict_quotes", "<tool_call>{'name': 'a', 'arguments': {}}</tool_call>", [], [["malformed JSON", "expected {\"name\""]]),
    ("missing_name", '<tool_call>{"arguments": {"x": 1}}</tool_call>', [], ['has no "name"']),
    ("name_not_string", '<tool_call>{"name": 3, "arguments": {}}</tool_call>', [], ['"name" must be a non-empty string, got 3']),
    ("empty_name", '<tool_call>{"name": "  ", "arguments": {}}</tool_call>', [], ['"name" must be a non-empty string']),
    ("arguments_is_array", '<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>', [],
     [["tool call 'a'", '"arguments" must be a JSON object, got an array']]),
    ("arguments_string_not_json", '<tool_call>{"name": "a", "arguments": "{x: 1}"}</tool_call>', [],
     ['the "arguments" string is not valid JSON']),
    ("arguments_string_not_object", '<tool_call>{"name": "a", "arguments": "[1]"}</tool_call>', [],
     ['"arguments" must be a JSON object, got an array']),
    ("call_not_object", "<tool_call>42</tool_call>", [], [["must be a JSON object", "got a number"]]),
    ("empty_block", "<tool_call>\n</tool_call>", [], ["empty <tool_call> block"]),
    ("unclosed_at_end", 'Let me check.\n<tool_call>\n{"name": "a", "arguments": {}}', [], [["unclosed <tool_call> tag", "ended before"]]),
    ("unclosed_then_new_block",
     '<tool_call>{"name": "a", "arguments": {}}\n<tool_call>{"name": "b", "arguments": {}}</tool_call>',
     [("b", {})], ["unclosed <tool_call> tag: a new <tool_call> began"]),
    ("stray_close", 'oops</tool_call> <tool_call>{"name": "a", "arguments": {}}</tool_call>', [("a", {})],
     ["stray </tool_call>"]),
    ("good_then_bad_then_good",
     ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {</tool_call>'
      '<tool_call>{"name": "c", "arguments": {}}</tool_call>'),
     [("a", {}), ("c", {})], ["malformed JSON"]),
    ("extra_data_after_object", '<tool_call>{"name": "a", "arguments": {}} {"name": "b"}</tool_call>', [], [["malformed JSON", "Extra data"]]),
]

QWEN3_CODER_CASES: list[Case] = [
    ("two_params_typed_by_schema",
     ("<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n</function>\n</tool_call>"),
     [("get_weather", {"city": "San Francisco", "days": 3})], []),
    ("multiline_code_kept_verbatim",
     ("<think>I'll run code.</think>\n<tool_call>\n<function=python>\n<parameter=code>\nfor i in range(3):\n"
      "    print(i)\n\n</parameter>\n</function>\n</tool_call>"),
     [("python", {"code": "for i in range(3):\n    print(i)\n"})], []),
    ("numeric_string_stays_string_by_schema",
     "<tool_call><function=get_weather><parameter=city>1984</parameter></function></tool_call>",
     [("get_weather", {"city": "1984"})], []),
    ("array_bool_number_and_null",
     ("<tool_call>\n<function=zoom>\n<parameter=image_id>\nimg_2\n</parameter>\n<parameter=bbox>\n[0, 0, 5, 5]\n"
      "</parameter>\n<parameter=factor>\n2.5\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=configure>\n<parameter=verbose>\nTrue\n</parameter>\n<parameter=limit>\nnull\n"
      "</parameter>\n<parameter=options>\n{'a': 1}\n</parameter>\n</function>\n</tool_call>"),
     [("zoom", {"image_id": "img_2", "bbox": [0, 0, 5, 5], "factor": 2.5}),
      ("configure", {"verbose": True, "limit": None, "options": {"a": 1}})], []),
    ("no_schema_guesses_json",
     "<tool_call><function=unknown_tool><parameter=n>7</parameter><parameter=s>hi</parameter></function></tool_call>",
     [("unknown_tool", {"n": 7, "s": "hi"})], []),
    ("no_parameters", "<tool_call>\n<function=finish>\n</function>\n</tool_call>", [("finish", {})], []),
    # ---- malformed ----------------------------------------------------------------------------
    ("missing_function_tag", "<tool_call>{\"name\": \"a\"}</tool_call>", [], ["expected <function=NAME>"]),
    ("unclosed_function", "<tool_call><function=a><parameter=x>1</parameter></tool_call>", [], ["unclosed <function=a>"]),
    ("unclosed_parameter", "<tool_call><function=a><parameter=x>1<parameter=y>2</parameter></function></tool_call>", [],
     ["unclosed <parameter=x>"]),
    ("duplicate_parameter", "<tool_call><function=a><parameter=x>1</parameter><parameter=x>2</parameter></function></tool_call>",
     [], ["parameter 'x' is given twice"]),
    ("empty_function_name", "<tool_call><function=><parameter=x>1</parameter></function></tool_call>", [], ["empty function name"]),
    ("unclosed_tool_call", "<tool_call><function=a></function>", [], ["unclosed <tool_call> tag"]),
]
