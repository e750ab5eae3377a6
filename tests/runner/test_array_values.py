"""numpy arrays and pandas values as output variables (`-o df`): data-only forms, no pickle.

Found by a first-hour user: `-o df` for a DataFrame, a Series or a numpy array was a
TypeError with our internal frames in the traceback. The round trip through a real confined
child first, then the encoder and decoder against each other with hypothesis, then what a
hostile child could send in their place.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager
from sandbox_kernel_ext.runner.child.array_values import encode_array_value
from sandbox_kernel_ext.runner.trusted.array_values import decode_array_value
from sandbox_kernel_ext.runner.trusted.crossing_text import valid_unicode
from sandbox_kernel_ext.runner.wire import ARRAY_TAG, FRAME_TAG, decode_value, encode_value

MAKE = """
import numpy as np, pandas as pd
frame = pd.DataFrame({
    "n": [1, 2, 3],
    "x": [0.5, float("nan"), 2.0],
    "label": ["a", None, "ü"],
    "flag": [True, False, True],
    "when": pd.to_datetime(["2026-01-01", "2026-06-01", "2026-11-27"]),
    "zoned": pd.to_datetime(["2026-01-01 10:00"] * 3).tz_localize("Europe/Paris"),
    "kind": pd.Categorical(["x", "y", "x"]),
    "maybe": pd.array([1, None, 3], dtype="Int64"),
}, index=pd.Index(["r1", "r2", "r3"], name="row"))
series = pd.Series([1.5, 2.5], index=[10, 20], name="amount")
matrix = np.arange(12, dtype=np.int32).reshape(3, 4)
words = np.array(["one", "two"])
nested = {"frame": frame.head(1), "arrays": [matrix[0], words]}
"""


def _expected() -> dict[str, Any]:
    scope: dict[str, Any] = {}
    exec(MAKE, scope)  # noqa: S102 - the same values, made here
    return scope


def _check(values: dict[str, Any]) -> None:
    want = _expected()
    pd.testing.assert_frame_equal(values["frame"], want["frame"])
    pd.testing.assert_series_equal(values["series"], want["series"])
    np.testing.assert_array_equal(values["matrix"], want["matrix"])
    assert values["matrix"].dtype == np.int32 and values["words"].tolist() == ["one", "two"]
    pd.testing.assert_frame_equal(values["nested"]["frame"], want["frame"].head(1))
    np.testing.assert_array_equal(values["nested"]["arrays"][0], want["matrix"][0])


NAMES = ["frame", "series", "matrix", "words", "nested"]


@pytest.mark.parametrize("interface", ["run_python", "session"])
def test_pandas_and_numpy_values_come_back_whole(manager: SandboxManager, interface: str) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    if interface == "run_python":
        result = manager.run_python(sid, MAKE, outputs=NAMES, timeout=120)
    else:
        with manager.start_session(sid) as session:
            result = session.run_cell(MAKE, outputs=NAMES, timeout=120)
    assert result.exit_code == 0, result.stderr or result.error
    _check(result.variables)


@pytest.mark.parametrize("code, words", [
    ("value = np.array([object(), 1], dtype=object)", "array of Python objects"),
    ("value = pd.DataFrame({'a': [{'k': 1}]})", "column of Python objects (dict)"),
    ("value = pd.DataFrame({'a': [1]}, index=pd.MultiIndex.from_tuples([(1, 2)]))",
     "MultiIndex"),
    ("value = pd.DataFrame([[1]], columns=pd.MultiIndex.from_tuples([('a', 'b')]))",
     "several levels of column names"),
])
def test_what_would_need_pickle_is_refused_with_the_way_forward(
        manager: SandboxManager, code: str, words: str) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    result = manager.run_python(sid, "import numpy as np, pandas as pd\n" + code,
                                outputs=["value"], timeout=120)
    assert result.exit_code != 0 and words in result.stderr, result.stderr
    assert "wire.py" not in result.stderr


# -- the two sides against each other ------------------------------------------------------------

def _round_trip(value: Any) -> Any:
    sent = json.loads(json.dumps(encode_value(value, "v", other=encode_array_value)))
    return decode_value(sent, decode_array_value)


_dtypes = (hnp.integer_dtypes() | hnp.unsigned_integer_dtypes() | hnp.floating_dtypes()
           | hnp.complex_number_dtypes() | hnp.boolean_dtypes() | hnp.datetime64_dtypes()
           | hnp.unicode_string_dtypes(max_len=6) | hnp.byte_string_dtypes(max_len=6))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hnp.arrays(_dtypes, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)))
def test_arrays_round_trip(array: np.ndarray) -> None:
    back = _round_trip(array)
    assert back.dtype == array.dtype and back.shape == array.shape
    if array.dtype.kind == "U":  # lone surrogates become U+FFFD (the kernel's messages)
        array = np.array([valid_unicode(item) for item in array.ravel().tolist()],
                         dtype=array.dtype).reshape(array.shape)
    np.testing.assert_array_equal(back, array)


_cells = st.one_of(st.none(), st.text(max_size=5), st.integers(-10 ** 6, 10 ** 6),
                   st.booleans())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(allow_nan=True, allow_infinity=True), _cells,
                          st.integers(-5, 5)), max_size=6),
       st.lists(st.text(max_size=4), min_size=3, max_size=3))
def test_frames_round_trip(rows: list[tuple[float, Any, int]], names: list[str]) -> None:
    frame = pd.DataFrame(rows, columns=names) if rows else pd.DataFrame(columns=names)
    back = _round_trip(frame)
    pd.testing.assert_frame_equal(back, frame, check_dtype=bool(rows), check_index_type=bool(rows),
                                  check_column_type=False)


# -- what a hostile child could send instead -----------------------------------------------------

def _npy(array: np.ndarray, allow_pickle: bool = False) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return base64.b64encode(buffer.getvalue()).decode()


class _Boom:
    def __reduce__(self) -> Any:
        return (os.system, ("touch /tmp/sbx-array-pwned",))


@pytest.mark.parametrize("tagged", [
    {ARRAY_TAG: _npy(np.array([_Boom()], dtype=object), allow_pickle=True)},
    {ARRAY_TAG: base64.b64encode(pickle.dumps(_Boom())).decode()},
    {ARRAY_TAG: base64.b64encode(b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, "
                                 b"'shape': (10000000000,), }" + b" " * 40 + b"\n").decode()},
    {ARRAY_TAG: "not base64!"},
    {ARRAY_TAG: 7},
    {FRAME_TAG: {"columns": ["a"], "index": {"list": [1], "dtype": "int64", "name": None},
                 "data": [{"list": [{"k": 1}], "dtype": "object", "name": None}]}},
    {FRAME_TAG: {"columns": ["a", "b"], "index": {"list": [1], "dtype": "int64", "name": None},
                 "data": [{"list": [1], "dtype": "object", "name": None}]}},
    {FRAME_TAG: {"columns": ["a"], "index": {"list": [1, 2], "dtype": "int64", "name": None},
                 "data": [{"list": [1], "dtype": "int64", "name": None}]}},
    {FRAME_TAG: {"columns": [{"x": 1}], "index": {"list": [], "dtype": "int64", "name": None},
                 "data": [{"list": [], "dtype": "int64", "name": None}]}},
])
def test_a_forged_value_is_malformed_and_runs_nothing(tagged: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        decode_value(json.loads(json.dumps(tagged)), decode_array_value)
    assert not os.path.exists("/tmp/sbx-array-pwned")


def _header_only(descr: str, shape: tuple[int, ...]) -> str:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    return base64.b64encode(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
                            + header.encode()).decode()


@pytest.mark.parametrize("tagged", [
    {ARRAY_TAG: _header_only("<U0", (300_000_000,))},  # no bytes, yet 300 M items to clean
    {ARRAY_TAG: _header_only("|S0", (10 ** 9,))},
    {ARRAY_TAG: _npy(np.array([("\udc80",)], dtype=[("a", "<U3")]))},  # a lone surrogate in a field
])
def test_found_in_review_arrays_that_cost_the_kernel_are_malformed(tagged: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        decode_value(json.loads(json.dumps(tagged)), decode_array_value)


def test_found_in_review_a_dtype_name_cannot_ask_for_gigabytes() -> None:
    """`"dtype": "S400000000"` on a column of 20 short strings made the kernel hold 15 GB."""
    column = {"list": ["x"] * 20, "dtype": "S400000000", "name": None}
    back = decode_array_value("__sandbox_index__", column)
    assert list(back) == ["x"] * 20


def test_found_in_review_tens_of_thousands_of_columns_end_in_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """85,000 empty category columns in a value under the size cap took 35 s of the
    kernel's time to read; the read stops at its time budget and the value is malformed."""
    monkeypatch.setattr("sandbox_kernel_ext.runner.trusted.array_values.READ_SECONDS", 0.2)
    column = {"codes": _npy(np.zeros(0, dtype=np.int8)), "ordered": False, "dtype": "category",
              "categories": {"list": [], "dtype": "object", "name": None}, "name": None}
    frame = {FRAME_TAG: {"columns": [str(i) for i in range(20_000)],
                         "index": {"range": [0, 0, 1], "dtype": "int64", "name": None},
                         "data": [column] * 20_000}}
    with pytest.raises(ValueError, match="to read"):
        decode_value(frame, decode_array_value)


def test_a_dtype_name_is_only_a_name() -> None:
    """A dtype pandas cannot parse leaves the values as read; it is never evaluated."""
    column = {"list": ["1"], "dtype": "__import__('os').system('touch /tmp/sbx-array-pwned')",
              "name": None}
    back = decode_array_value("__sandbox_index__", column)
    assert list(back) == ["1"] and not os.path.exists("/tmp/sbx-array-pwned")
