"""What each tool env's tools and tasks do: the arithmetic chains, the shop's rules and
final-state grading, the puzzle solvers against brute force, the chart zoom's pixels, and the
encyclopedia's search and answers."""

from __future__ import annotations

import contextlib
import io
import itertools
import json

import numpy as np
import pytest
from relax_gym.envs import calc_arithmetic, chart_zoom, doc_search, py_puzzle
from relax_gym.tools import HermesParser
from relax_gym.tools.calculator import evaluate

import relax_gym
from relax_gym.types import ImagePart, ToolCall

HERMES = HermesParser()


def call(name: str, **arguments: object) -> str:
    return HERMES.render([ToolCall(name, dict(arguments))])


# -- CalcArithmetic -------------------------------------------------------------------------------
@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_chains_are_exact_large_and_match_the_calculator(difficulty: str) -> None:
    level = calc_arithmetic.LEVELS[difficulty]
    rng = np.random.default_rng(7)
    for _ in range(200):
        start, ops = calc_arithmetic.make_chain(rng, level)
        kinds = [op.kind if op.kind not in ("add", "sub") else "addsub" for op in ops]
        assert kinds == list(level.plan)  # the plan's steps, in order
        value, peak = start, start
        expression = str(start)
        for op in ops:
            if op.kind == "div":
                assert value % op.n == 0
            value = op.apply(value)
            assert value > 0
            peak = max(peak, value)
            expression = op.expression(expression)
        assert evaluate(expression) == value == calc_arithmetic.run_chain(start, ops)
        assert peak >= 10**4  # too big to do reliably in one's head


def test_calc_prompt_lists_the_steps_it_grades() -> None:
    env = relax_gym.make("relax/CalcArithmetic-v0", difficulty="hard")
    obs, _ = env.reset(seed=4)
    task = env.unwrapped
    assert f"Start with {task.start:,}." in obs.text
    for op in task.ops:
        assert op.text() in obs.text
    _, reward, _, _, info = env.step(call("submit_answer", answer=f"{task.require_task().target:,}"))
    assert info["success"] and reward == 1.0  # thousands separators are fine
    env.reset(seed=4)
    _, reward, _, _, info = env.step(call("submit_answer", answer=str(task.require_task().target + 1)))
    assert not info["success"] and info["well_formed"] and reward == pytest.approx(0.1)


# -- ShopDB ---------------------------------------------------------------------------------------
def _shop(difficulty: str, want: str, seeds: range = range(200)) -> tuple[relax_gym.Env, int]:
    env = relax_gym.make("relax/ShopDB-v0", difficulty=difficulty)
    for seed in seeds:
        env.reset(seed=seed)
        if env.unwrapped.request.kind == want:
            return env, seed
    raise AssertionError(f"no {want} request in {seeds}")


def test_refused_operations_are_errors_that_change_nothing() -> None:
    env, _ = _shop("hard", "refund_all")
    db = env.unwrapped.db
    before = db.state()
    delivered = next(o for o in db.orders.values() if o.status == "delivered")
    shipped = next(o for o in db.orders.values() if o.status == "shipped")
    empty = next(p for p in db.products.values() if p.stock < 5)
    turn = HERMES.render([
        ToolCall("cancel_order", {"order_id": delivered.id}),
        ToolCall("refund_item", {"order_id": shipped.id, "product_id": next(iter(shipped.items)), "quantity": 1}),
        ToolCall("update_cart", {"product_id": empty.id, "quantity": empty.stock + 1}),
        ToolCall("place_order", {}),
        ToolCall("get_order", {"order_id": "O1"}),
        ToolCall("update_cart", {"product_id": "P1", "quantity": 1}),
    ])
    obs, reward, terminated, _, info = env.step(turn)
    texts = [m.text for m in obs.messages]
    assert texts[0] == f"Error: order {delivered.id} is delivered; only pending orders can be cancelled"
    assert texts[1] == f"Error: order {shipped.id} is shipped; only delivered orders can be refunded"
    assert texts[2].startswith(f"Error: only {empty.stock} of ") and "in stock" in texts[2]
    assert texts[3].startswith("Error: the cart is empty")
    assert texts[4].startswith("Error: no order with id 'O1'") and texts[5].startswith("Error: no product with id 'P1'")
    assert info["tools"]["tool_errors"] == 6 and not terminated and reward == 0.0
    assert db.state() == before


def test_final_state_grading_forgives_a_cancelled_mistake_not_a_wrong_order() -> None:
    env, seed = _shop("easy", "buy")
    name, quantity = env.unwrapped.request.facts["product"], env.unwrapped.request.facts["quantity"]
    product = next(p for p in env.unwrapped.db.products.values() if p.name == name)
    # a wrong order stays wrong
    env.step(call("update_cart", product_id=product.id, quantity=quantity - 1 or 2))
    env.step(call("place_order"))
    *_, info = env.step(call("finish", answer="done"))
    assert not info["success"] and info["reward_components"] == {"correct": 0.0}
    assert set(info["mismatched"]) == {"stock", "new_orders"}
    # the same mistake, cancelled and redone, is fine
    env.reset(seed=seed)
    env.step(call("update_cart", product_id=product.id, quantity=quantity - 1 or 2))
    obs, *_ = env.step(call("place_order"))
    wrong_id = json.loads(obs.messages[0].text)["order_id"]
    env.step(call("cancel_order", order_id=wrong_id))
    env.step(call("update_cart", product_id=product.id.lower(), quantity=quantity))  # ids are case-insensitive
    env.step(call("place_order"))
    _, reward, terminated, _, info = env.step("All done, your order is placed.")  # a plain reply ends it too
    assert terminated and info["success"] and reward == 1.0 and info["mismatched"] == []


def test_calls_of_one_turn_run_in_order_on_the_shared_database() -> None:
    env, _ = _shop("medium", "cart_cleanup")
    p = next(p for p in env.unwrapped.db.products.values() if p.stock >= 3)
    turn = HERMES.render([ToolCall("update_cart", {"product_id": p.id, "quantity": q}) for q in (1, 2, 3, 0, 2)])
    obs, *_ = env.step(turn)
    seen = [next((i["quantity"] for i in json.loads(m.text)["items"] if i["product_id"] == p.id), 0) for m in obs.messages]
    assert seen == [1, 2, 3, 0, 2] and env.unwrapped.db.cart[p.id] == 2


def test_search_products_filters() -> None:
    env = relax_gym.make("relax/ShopDB-v0", difficulty="hard")
    env.reset(seed=2)
    db = env.unwrapped.db
    cheap = db.search(category="kitchen", max_price=30)
    assert all(p["category"] == "kitchen" and p["price"] <= 30 for p in cheap)
    assert len(db.search()) == len(db.products)
    some = next(iter(db.products.values()))
    noun = some.name.split()[-1]
    assert some.view() in db.search(noun + "s")  # a plural still finds it
    assert db.search("zzz") == []


# -- PyPuzzle -------------------------------------------------------------------------------------
def _josephus_brute(n: int, k: int) -> int:
    people, i = list(range(1, n + 1)), 0
    while len(people) > 1:
        i = (i + k - 1) % len(people)
        people.pop(i)
    return people[0]


def _paths_brute(grid: list[str]) -> int:
    rows, cols = len(grid), len(grid[0])
    count = 0
    for moves in itertools.combinations(range(rows + cols - 2), rows - 1):  # which moves go down
        r = c = 0
        ok = grid[0][0] == "."
        for step in range(rows + cols - 2):
            r, c = (r + 1, c) if step in moves else (r, c + 1)
            ok = ok and grid[r][c] == "."
        count += ok
    return count


def test_puzzle_solvers_agree_with_brute_force() -> None:
    rng = np.random.default_rng(0)
    primes = [p for p in range(2, 3000) if all(p % d for d in range(2, int(p**0.5) + 1))]
    for limit in (2, 3, 10, 11, 100, 2999):
        assert py_puzzle.prime_sum(limit) == sum(p for p in primes if p < limit)
    for n in range(1, 40):
        for k in range(1, 7):
            assert py_puzzle.josephus(n, k) == _josephus_brute(n, k)
    for hi in (1, 9, 10, 99, 1000, 4321, 20000):
        for s in range(30):
            assert py_puzzle.digit_sum_count(hi, s) == sum(1 for x in range(1, hi + 1) if sum(map(int, str(x))) == s)
    assert py_puzzle.collatz_steps(1) == 0 and py_puzzle.collatz_steps(6) == 8 and py_puzzle.collatz_steps(27) == 111
    assert py_puzzle.lcg_count(5, 3, 16, 1, 4, 8) == sum(1 for x in (8, 11, 10, 5) if x < 8)
    for _ in range(30):
        rows, cols = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        cells = rng.random((rows, cols)) < 0.25
        cells[0, 0] = False
        grid = ["".join("#" if b else "." for b in row) for row in cells]
        assert py_puzzle.grid_paths(grid) == _paths_brute(grid)


def test_solver_code_runs_on_its_own() -> None:
    """The oracle's program needs nothing from the module: run it in an empty namespace."""
    cases = {
        "collatz_steps": {"n": 27}, "prime_sum": {"limit": 100}, "josephus": {"n": 7, "k": 3},
        "lcg_count": {"a": 5, "c": 3, "m": 16, "seed": 1, "steps": 4, "below": 8},
        "digit_sum_count": {"hi": 1000, "s": 5}, "grid_paths": {"grid": ["..", ".."]},
    }
    assert set(cases) == set(py_puzzle.SOLVERS)
    for name, args in cases.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(py_puzzle.solver_code(name, args), {"__name__": "__main__"})  # noqa: S102 - our own code
        assert out.getvalue().strip() == str(py_puzzle.SOLVERS[name](**args)), name


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_puzzle_answers_match_their_solver_and_vary(difficulty: str) -> None:
    env = py_puzzle.PyPuzzleTask(difficulty)
    families = set()
    for seed in range(40):
        env.reset(seed=seed)
        families.add(env.solver)
        assert env.require_task().target == py_puzzle.SOLVERS[env.solver](**env.args)
        code = py_puzzle.solver_code(env.solver, env.args)
        assert code.rstrip().endswith(")") and "print(" in code
    assert len(families) >= 4


def test_python_tool_errors_come_back_and_the_episode_goes_on() -> None:
    env = relax_gym.make("relax/PyPuzzle-v0")
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(call("python", code="print(1 // 0)"))
    assert "ZeroDivisionError" in obs.messages[0].text and "[exit code 1]" in obs.messages[0].text
    assert not terminated and reward == 0.0 and info["tools"]["budget_left"] == env.env.max_tool_calls - 1


# -- ChartZoom ------------------------------------------------------------------------------------
def test_labels_are_unreadable_in_the_chart_and_exact_in_a_zoom() -> None:
    env = relax_gym.make("relax/ChartZoom-v0", difficulty="hard")
    obs, _ = env.reset(seed=3)
    task = env.unwrapped
    (shown,) = obs.parts(ImagePart)
    assert shown.id == "chart" and shown.image.size == chart_zoom.SHOWN
    chart = task.chart
    for box in [b for row in chart.value_boxes for b in row] + chart.category_boxes:
        assert (box[3] - box[1]) / chart_zoom.SCALE < 4.0  # glyphs under 4 px tall once shown
    box = chart.value_boxes[0][0]
    bbox = chart_zoom.shown_box(box, pad=4)
    obs, *_ = env.step(call("zoom", image_id="chart", bbox=bbox))
    zoomed = obs.parts(ImagePart)[0]
    assert zoomed.id == "zoom_1" and "[image id: zoom_1," in obs.messages[0].text
    src = tuple(c * chart_zoom.SCALE for c in bbox)
    assert zoomed.image.tobytes() == task.source.crop(src).tobytes()  # full-resolution pixels
    assert zoomed.image.size[1] >= box[3] - box[1]
    # zoom into the zoom: its pixels map back to the source
    obs, *_ = env.step(call("zoom", image_id="zoom_1", bbox=[2, 3, 30, 20]))
    again = obs.parts(ImagePart)[0]
    assert again.id == "zoom_2"
    assert again.image.tobytes() == task.source.crop((src[0] + 2, src[1] + 3, src[0] + 30, src[1] + 20)).tobytes()


def _covers(view: chart_zoom.View, box: tuple[int, int, int, int]) -> bool:
    """The zoom shows the whole box, at no less than 77% of its drawn size (readable)."""
    right, bottom = view.x0 + view.size[0] * view.scale, view.y0 + view.size[1] * view.scale
    inside = view.x0 <= box[0] and view.y0 <= box[1] and box[2] <= right and box[3] <= bottom
    return inside and view.scale <= 1.3


def test_the_oracle_zooms_cover_every_label_it_answers_from() -> None:
    env = relax_gym.make("relax/ChartZoom-v0", difficulty="hard")
    for seed in range(8):
        env.reset(seed=seed)
        task, tool_env = env.unwrapped, env.env
        env.step(next(iter(env.oracle())))
        zooms = [v for k, v in tool_env._ctx.scratch[chart_zoom._VIEWS].items() if k != "chart"]
        for i, j in task.needs["cells"]:
            assert any(_covers(v, task.chart.value_boxes[i][j]) for v in zooms), (seed, i, j)
            assert any(_covers(v, task.chart.category_boxes[i]) for v in zooms), (seed, i)
        if len(task.chart.series) > 1:
            assert any(_covers(v, task.chart.legend_box) for v in zooms), seed


def test_zoom_errors_are_messages() -> None:
    env = relax_gym.make("relax/ChartZoom-v0")
    env.reset(seed=0)
    obs, *_ = env.step(HERMES.render([
        ToolCall("zoom", {"image_id": "nope", "bbox": [0, 0, 10, 10]}),
        ToolCall("zoom", {"image_id": "chart", "bbox": [10, 10, 5, 20]}),
        ToolCall("zoom", {"image_id": "chart", "bbox": [400, 300, 500, 400]}),
    ]))
    texts = [m.text for m in obs.messages]
    assert texts[0] == "Error: no image with id 'nope' to zoom into (image ids: chart)"
    assert texts[1].startswith("Error: bbox [10, 10, 5, 20] is empty")
    assert texts[2] == "Error: bbox [400, 300, 500, 400] lies outside the image, which is 320x240 pixels"


# -- DocSearch ------------------------------------------------------------------------------------
def test_answer_normalisation() -> None:
    n = doc_search.normalize
    assert n("The Danbel River") == n("danbel") == "danbel"
    assert n("264,300") == n("264300") and n("1632.") == "1632"
    assert n("") is None and n("x" * 60) is None and n("a;b") is None


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_encyclopedia_has_unique_titles_and_the_stated_hops(difficulty: str) -> None:
    env = doc_search.DocSearchTask(difficulty)
    level = doc_search.LEVELS[difficulty]
    for seed in range(10):
        env.reset(seed=seed)
        titles = [d.title for d in env.documents]
        assert len(titles) == len(set(titles)) == level.towns + level.people + level.inventions
        assert len(env.chain) == level.hops
        assert all(len(d.text) <= 600 for d in env.documents)  # search shows whole articles
    if level.shared_words:
        words = [d.title.split()[0] for d in env.documents if len(d.title.split()) == 2 and d.title.split()[1] in doc_search.DEVICES]
        assert len(set(words)) == len(words) // 2


def test_search_finds_the_article_and_a_wrong_answer_is_graded_as_such() -> None:
    env = relax_gym.make("relax/DocSearch-v0", difficulty="medium")
    env.reset(seed=9)
    start = env.unwrapped.start
    obs, *_ = env.step(call("search", query=start, k=3))
    hits = json.loads(obs.messages[0].text)
    assert hits[0]["title"] == start and len(hits) <= 3
    _, reward, terminated, _, info = env.step(call("submit_answer", answer="Nowhere"))
    assert terminated and not info["success"] and reward == pytest.approx(0.1)
