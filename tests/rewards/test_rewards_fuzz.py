"""Property-based fuzzing of the answer rewards: they never raise, never run past their time budget
(math equivalence has a hard one: SymPy runs in a worker process that is killed), and an answer is
always equivalent to itself."""

from __future__ import annotations

import statistics
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from horizonrl.math_answer import extract_math_answer, math_equivalent  # noqa: E402
from horizonrl.rewards import exact_match, math_reward, token_f1  # noqa: E402
from horizonrl.sympy_worker import default_worker  # noqa: E402

BUDGET = 0.5  # seconds of SymPy per math_equivalent call in these tests
SLACK = 2.0  # killing the worker, the in-process checks and a loaded 2-core machine

# Pieces of adversarial math answers: huge powers, deep nesting, long literals, LaTeX macros, symbols.
PIECES = [
    "(", ")", "{", "}", "[", "]", "^", "**", "^{", "9", "99", "999", "9999", "1e999999", ".5", "0.",
    "\\frac{", "\\dfrac", "\\sqrt{", "\\sqrt[3]{", "\\boxed{", "\\text{", "\\left(", "\\right)", "\\cdot",
    "x", "y", "e", "pi", "\\pi", "sin(", "exp(", "log(", "+", "-", "*", "/", ",", "\\{", "\\}", "%", "$",
    "=", " ", "####", "\\infty", "!", "__import__", "\\\\",
]  # fmt: skip
piece = st.sampled_from(PIECES)
chunk = st.tuples(piece, st.integers(1, 3000)).map(lambda t: t[0] * t[1] if t[1] > 2500 else t[0])
adversarial = st.lists(chunk, min_size=1, max_size=40).map("".join)
answers = st.one_of(
    st.text(max_size=200), adversarial, st.from_regex(r"-?\d{1,6}(/\d{1,4})?", fullmatch=True)
)
golds = st.one_of(st.just("1"), st.just("x+1"), st.just("\\frac{1}{2}"), answers)

FUZZ = settings(
    max_examples=120,
    deadline=None,  # time is asserted below, against the reward's own budget
    derandomize=True,  # the default suite stays deterministic
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)


@pytest.fixture(scope="module", autouse=True)
def _warm_worker():
    default_worker().start()
    assert math_equivalent("\\sqrt{2}/2", "1/\\sqrt{2}")  # waits for the first worker: start-up is not timed


@FUZZ
@given(pred=answers, gold=golds)
def test_math_equivalence_never_raises_and_stays_within_its_budget(pred, gold):
    t0 = time.perf_counter()
    verdict = math_equivalent(pred, gold, timeout_s=BUDGET)
    elapsed = time.perf_counter() - t0
    assert isinstance(verdict, bool)
    assert elapsed <= BUDGET + SLACK, (elapsed, pred[:80], gold[:80])
    assert math_reward(pred, [gold], timeout_s=BUDGET) in (0.0, 1.0)


@FUZZ
@given(text=answers)
def test_an_answer_is_equivalent_to_itself(text):
    assert exact_match(text, text) == 1.0
    assert token_f1(text, text) == 1.0
    if extract_math_answer(text):
        assert math_equivalent(text, text, timeout_s=BUDGET)
    assert exact_match(None, text) == 0.0 and not math_equivalent(None, text)


@FUZZ
@given(pred=answers, gold=answers)
def test_text_rewards_never_raise_and_stay_in_range(pred, gold):
    assert exact_match(pred, [gold, "x"]) in (0.0, 1.0)
    assert 0.0 <= token_f1(pred, [gold]) <= 1.0


CRAFTED = [
    "9^{9^{9^{9}}}",
    "10^{100000}",
    "2^{2^{2^{2^{2^{2}}}}}",
    "(" * 5000 + "1" + ")" * 5000,
    "{" * 3000 + "1" + "}" * 3000,
    "\\frac{" * 2000,
    "-" * 10000 + "1",
    "1e999999999",
    "9" * 5000,
    "\\sqrt{" * 500 + "2" + "}" * 500,
    "(x+1)^{999} - (x+2)^{999}",
    "x^{999}*y^{999}",
    "exp(exp(exp(exp(100))))",
    "(10^{300})^{1000}",
    "((((((((((x+1)^2)^2)^2)^2)^2)^2)^2)^2)^2)",
    "\\{" + ",".join(str(i) for i in range(2000)) + "\\}",
    "\\boxed{" * 10000,
    "$" * 100000,
    "\\text{" * 5000,
    "(x-1)" + "".join(f"(x+{i})" for i in range(40)),
]


@pytest.mark.parametrize("answer", CRAFTED, ids=range(len(CRAFTED)))
def test_crafted_adversarial_answers_are_judged_within_the_budget(answer):
    for gold in ("1", "x+1"):
        t0 = time.perf_counter()
        assert math_equivalent(answer, gold, timeout_s=BUDGET) is False
        assert time.perf_counter() - t0 <= BUDGET + SLACK


def test_a_runaway_sympy_comparison_is_killed_and_the_next_one_works():
    worker = default_worker()
    assert math_equivalent("x^2-1", "(x-1)(x+1)", timeout_s=10.0)  # the worker is up (after earlier kills)
    before = dict(worker.stats)
    t0 = time.perf_counter()
    # nested exponentials pass the guards but SymPy's numeric evaluation does not finish
    assert math_equivalent("exp(exp(exp(exp(100))))", "1", timeout_s=0.3) is False
    assert time.perf_counter() - t0 <= 0.3 + SLACK
    assert worker.stats["timeouts"] == before["timeouts"] + 1
    time.sleep(1.0)  # the replacement child imports SymPy in the background
    assert math_equivalent("2\\sqrt{2}", "\\sqrt{8}", timeout_s=5.0)


def test_cost_per_call(capsys):
    """Median wall time of in-process (numeric) and worker (symbolic) comparisons; printed for the docs."""
    numeric = [("\\frac{3}{4}", "0.75"), ("50\\%", "0.5"), ("1,000", "1000"), ("(1, 2)", "(1,2)")]
    symbolic = [
        ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}"),
        ("x^2-1", "(x-1)(x+1)"),
        ("\\pi/2", "1.5707963267948966"),
    ]

    def median_s(pairs, reps):
        times = []
        for _ in range(reps):
            for a, b in pairs:
                t0 = time.perf_counter()
                assert math_equivalent(a, b)
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    fast, slow = median_s(numeric, 50), median_s(symbolic, 10)
    with capsys.disabled():
        print(f"\nmath_equivalent median per call: numeric {fast * 1e6:.0f} us, symbolic {slow * 1e3:.1f} ms")
    assert fast < 0.005 and slow < 0.5
