"""calculator (AST walk, no eval), search (BM25), image tools, answer tools, builtin registry."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from PIL import Image
from relax_gym.tools import (
    BM25Index,
    Document,
    ToolContext,
    builtin_tools,
    calculator,
    crop,
    finish,
    rotate,
    search,
    submit_answer,
    zoom,
)
from relax_gym.tools.calculator import evaluate

from relax_gym.types import ImagePart


# ------------------------------------------------------------------------------------------------
# calculator
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2+3", "5"),
        ("(3 + 4) * 2^10", "7168"),
        ("2^3^2", "512"),
        ("2**100", str(2**100)),
        ("7 / 2", "3.5"),
        ("8 / 2", "4"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("sqrt(16) + abs(-2)", "6"),
        ("round(pi, 4)", "3.1416"),
        ("log(e)", "1"),
        ("log(8, 2)", "3"),
        ("factorial(20)", str(math.factorial(20))),
        ("comb(10, 3) + gcd(12, 18)", "126"),
        ("max(1, 5, 3) - min(4, 2)", "3"),
        ("3 × 4 − 2 ÷ 2", "11"),
        ("1e3 + 0.5", "1000.5"),
        ("sin(0) + cos(0)", "1"),
        ("0.1 + 0.2", "0.3"),
    ],
)
def test_calculator_values(expression: str, expected: str) -> None:
    result = calculator.invoke({"expression": expression})
    assert not result.is_error, result.text
    assert result.text == expected


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("__import__('os').system('id')", "unknown function"),
        ("().__class__", "unsupported syntax"),
        ("open('/etc/passwd')", "unknown function 'open'"),
        ("x + 1", "unknown name 'x'"),
        ("'a' * 3", "only numbers are allowed"),
        ("[1, 2]", "unsupported syntax"),
        ("lambda: 1", "unsupported syntax"),
        ("1 / 0", "division by zero"),
        ("2 ** 10 ** 10", "exponent too large"),
        ("9 ** 99999", "too large"),
        ("factorial(10000)", "factorial() needs 0 <= n <= 1000"),
        ("sqrt(-1)", "math domain error"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "cannot parse"),
        ("", "the expression is empty"),
        ("1" * 600, "longer than 500 characters"),
        ("True + 1", "only numbers are allowed"),
        ("round(1.5, n=1)", "keyword arguments are not supported"),
        ("-" * 80 + "1", "nested too deeply"),
        ("(" * 240 + "1" + ")" * 240, "cannot parse"),  # deeper than Python's parser allows
    ],
)
def test_calculator_refuses_safely(expression: str, fragment: str) -> None:
    result = calculator.invoke({"expression": expression})
    assert result.is_error and result.error_kind == "tool_error"
    assert fragment in result.text, result.text


def test_calculator_keeps_integers_exact() -> None:
    assert evaluate("2**64 + 1") == 18446744073709551617
    assert isinstance(evaluate("6 / 3"), int)


# ------------------------------------------------------------------------------------------------
# search
# ------------------------------------------------------------------------------------------------
DOCS = [
    {"id": "a", "title": "Cats", "text": "Cats are small carnivorous mammals. Cats purr."},
    {"id": "b", "title": "Dogs", "text": "Dogs are loyal mammals that bark."},
    {"id": "c", "title": "Birds", "text": "Birds have feathers and most can fly."},
    "A plain string document about cats and dogs living together.",
]


def test_bm25_ranking() -> None:
    index = BM25Index(DOCS)
    hits = index.search("cats purr", k=3)
    assert [d.id for d, _ in hits] == ["a", "3"]  # doc 'a' mentions cats twice and purr
    assert hits[0][1] > hits[1][1] > 0
    assert index.search("feathers")[0][0].id == "c"
    assert index.search("quantum") == []
    assert index.search("mammals", k=1)[0][0].id in ("a", "b")
    assert isinstance(index.documents[3], Document) and index.documents[3].id == "3"


def test_bm25_ties_keep_collection_order() -> None:
    index = BM25Index(["same words here", "same words here", "other"])
    assert [d.id for d, _ in index.search("words")] == ["0", "1"]


def test_search_tool_reads_the_env_documents_once_per_episode() -> None:
    calls = {"n": 0}

    class Env:
        def documents(self) -> list:
            calls["n"] += 1
            return DOCS

    ctx = ToolContext(env=Env())
    first = json.loads(search.invoke({"query": "dogs bark"}, ctx).text)
    assert first[0]["id"] == "b" and first[0]["title"] == "Dogs" and first[0]["score"] > 0
    search.invoke({"query": "birds", "k": 1}, ctx)
    assert calls["n"] == 1  # the index is cached for the episode
    assert search.invoke({"query": "zebra"}, ctx).text == "no document matches 'zebra'"
    assert search.invoke({"query": "x", "k": 50}, ctx).error_kind == "bad_arguments"
    assert search.invoke({"query": "   "}, ctx).text == "the query is empty"


def test_search_with_a_prebuilt_index_or_none() -> None:
    ctx = ToolContext(env=SimpleNamespace(search_index=BM25Index(DOCS)))
    assert json.loads(search.invoke({"query": "feathers"}, ctx).text)[0]["id"] == "c"
    r = search.invoke({"query": "cats"}, ToolContext(env=object()))
    assert r.is_error and r.text == "this environment has no documents to search"


# ------------------------------------------------------------------------------------------------
# image tools
# ------------------------------------------------------------------------------------------------
def image_ctx() -> ToolContext:
    img = Image.new("RGB", (40, 20), "white")
    img.putpixel((5, 5), (255, 0, 0))
    img.putpixel((30, 15), (0, 0, 255))
    return ToolContext(images={"pic": ImagePart(img, id="pic")})


def only_image(result) -> Image.Image:  # type: ignore[no-untyped-def]
    assert not result.is_error, result.text
    (part,) = result.content
    assert isinstance(part, ImagePart)
    return part.image


def test_crop_and_zoom() -> None:
    ctx = image_ctx()
    cropped = only_image(crop.invoke({"image_id": "pic", "bbox": [0, 0, 10, 10]}, ctx))
    assert cropped.size == (10, 10) and cropped.getpixel((5, 5)) == (255, 0, 0)
    zoomed = only_image(zoom.invoke({"image_id": "pic", "bbox": [25, 10, 35, 20], "factor": 3}, ctx))
    assert zoomed.size == (30, 30)
    assert zoomed.getpixel((16, 16))[2] > 150  # the blue pixel, enlarged
    clipped = only_image(crop.invoke({"image_id": "pic", "bbox": [30, 10, 100, 100]}, ctx))
    assert clipped.size == (10, 10)  # clipped to the border


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"image_id": "pic", "bbox": [10, 10, 5, 20]}, "is empty"),
        ({"image_id": "pic", "bbox": [50, 50, 60, 60]}, "lies outside the image, which is 40x20"),
        ({"image_id": "other", "bbox": [0, 0, 1, 1]}, "no image with id 'other'"),
        ({"image_id": "pic", "bbox": [0, 0, 1, 1], "factor": 100}, "less than or equal to 8"),
    ],
)
def test_image_tool_errors(arguments: dict, fragment: str) -> None:
    r = zoom.invoke(arguments, image_ctx())
    assert r.is_error and fragment in r.text, r.text


def test_rotate() -> None:
    ctx = image_ctx()
    quarter = only_image(rotate.invoke({"image_id": "pic", "degrees": 90}, ctx))
    assert quarter.size == (20, 40) and quarter.getpixel((5, 34)) == (255, 0, 0)
    assert only_image(rotate.invoke({"image_id": "pic", "degrees": -270}, ctx)).tobytes() == quarter.tobytes()
    assert only_image(rotate.invoke({"image_id": "pic", "degrees": 360}, ctx)).size == (40, 20)
    tilted = only_image(rotate.invoke({"image_id": "pic", "degrees": 30}, ctx))
    assert tilted.size[0] > 40 and tilted.size[1] > 20


# ------------------------------------------------------------------------------------------------
# answers and the registry
# ------------------------------------------------------------------------------------------------
def test_answer_tools() -> None:
    r = submit_answer.invoke({"answer": 42})
    assert r.final_answer == "42" and not r.end_episode and r.text == "answer submitted"
    r = finish.invoke({})
    assert r.final_answer == "" and r.end_episode
    assert submit_answer.invoke({"answer": ["x"]}).error_kind == "bad_arguments"


def test_builtin_registry() -> None:
    reg = builtin_tools()
    assert reg.names() == ["calculator", "python", "search", "crop", "zoom", "rotate", "submit_answer", "finish"]
    for spec in reg.specs():
        assert spec.description and spec.parameters["type"] == "object"
        json.dumps(spec.to_openai())
