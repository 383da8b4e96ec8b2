"""Answer extraction and the reply checks of ``dsa-runtime eval`` on tricky strings."""

from __future__ import annotations

import json

import pytest

from dsa_runtime.evals.extract import canonical, check_calls, check_number, model_answer, reference_answer


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("The answer is 42.", "42"),
        ("So she pays $1,234.50 in total.", "1234.5"),
        ("Total: $18.00", "18"),
        ("It costs -$7 now", "-7"),
        ("The temperature is -5 degrees.", "-5"),
        ("10-3=7", "7"),  # a hyphen after a digit is a minus sign, not a sign of the next number
        ("10 - 3 = 7, so 7 - 10 = -3", "-3"),
        ("1,000,000 people and 3 dogs", "3"),
        ("numbers 1,2,3", "3"),  # commas that are not thousands separators split numbers
        ("She has 1,234 apples.", "1234"),
        ("pi is 3.14.", "3.14"),
        ("He ran 5.5 km, then 0.50 km", "0.5"),
        ("About 50% of 80 is 40%.", "40"),
        ("We get 2 apples.\n\n#### 2", "2"),
        ("first 7 then 1{,}000", "1000"),  # LaTeX thousands separator
        ("So x = \\boxed{12} and not 13.", "12"),  # a boxed answer wins over a later number
        ("\\boxed{1} ... final: \\boxed{\\text{\\$}1{,}800}.", "1800"),  # the last boxed, nested braces
        ("\\boxed{\\text{nothing}} then 9", None),  # a boxed answer without a number is invalid
        ("an open \\boxed{12 and 5", "5"),  # an unclosed box is not an answer
        ("no numbers here", None),
        ("", None),
        (None, None),
    ],
)
def test_model_answer(text, want):
    assert model_answer(text) == want


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
        ("He earns 10 * 2 = 20 dollars.\n#### 1,200", "1200"),
        ("#### -3", "-3"),
        ("18", "18"),
        (18, "18"),
        (2.50, "2.5"),
        ("$5.", "5"),
    ],
)
def test_reference_answer(answer, want):
    assert reference_answer(answer) == want


def test_reference_without_a_number_is_refused():
    with pytest.raises(ValueError, match="holds no number"):
        reference_answer("#### none")


def test_canonical_refuses_text():
    assert canonical("0012.500") == "12.5"
    with pytest.raises(ValueError):
        canonical("twelve")


def test_check_number():
    assert check_number("so 3 + 4 = 7.", "7") == (True, False, "7")
    assert check_number("so 3 + 4 = 8.", "7") == (False, False, "8")
    assert check_number("I do not know", "7") == (False, True, None)


def test_check_calls_orders_names_and_arguments():
    expected = [{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}},
                {"name": "get_time", "arguments": {"zone": "UTC"}}]
    right = [("get_weather", json.dumps({"days": 3, "city": "Oslo"})), ("get_time", '{"zone": "UTC"}')]
    assert check_calls(right, expected)[:2] == (True, False)
    assert check_calls(right[::-1], expected)[:2] == (False, False)  # order matters
    assert check_calls(right[:1], expected)[:2] == (False, False)  # a missing call
    wrong_value = [("get_weather", '{"city": "Oslo", "days": "3"}'), right[1]]  # "3" is not 3
    assert check_calls(wrong_value, expected)[:2] == (False, False)
    correct, invalid, parsed = check_calls([("get_weather", '{"city": "Oslo"'), right[1]], expected)
    assert (correct, invalid) == (False, True) and parsed[0]["arguments"] == '{"city": "Oslo"'
    assert check_calls([("get_weather", "[1, 2]")], expected[:1])[:2] == (False, True)  # not an object
    assert check_calls([], expected) == (False, True, [])
