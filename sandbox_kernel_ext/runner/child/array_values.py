"""numpy arrays and pandas DataFrames, Series and Indexes as output variables, in data-only
forms: no pickle crosses to the kernel.

Runs in the confined child (`cell.output_values`). An array becomes its `.npy` bytes saved
with `allow_pickle=False` (so an array of Python objects is refused here); a Series, an
Index or a DataFrame becomes its columns, each an array of that kind, or a list of plain
values (strings, numbers, None) for a column of Python objects, with its pandas dtype's name.
The kernel's side (`trusted/array_values.py`) reads nothing else. Tags: `wire.ARRAY_TAG`,
`wire.FRAME_TAG`, `wire.SERIES_TAG`, `wire.INDEX_TAG`.
"""

from __future__ import annotations

import base64
import io
import sys
from typing import Any

from ..wire import ARRAY_TAG, FRAME_TAG, INDEX_TAG, SERIES_TAG, encode_value

__all__ = ["encode_array_value"]

_PLAIN = (str, int, float, bool, type(None))


def encode_array_value(value: Any, name: str) -> dict[str, Any] | None:
    """The tagged form of a numpy or pandas value, or None for anything else (numpy and
    pandas are looked up, never imported here)."""
    numpy = sys.modules.get("numpy")
    pandas = sys.modules.get("pandas")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return {ARRAY_TAG: _npy(value, name)}
    if pandas is None:
        return None
    if isinstance(value, pandas.DataFrame):
        if isinstance(value.columns, pandas.MultiIndex):
            raise TypeError(f"output variable {name!r} has several levels of column names; "
                            "flatten them first (df.columns = ['_'.join(map(str, c)) for c in df.columns])")
        return {FRAME_TAG: {
            "columns": [encode_value(label, name) for label in value.columns],
            "index": _column(value.index, name),
            "data": [_column(value.iloc[:, position], name)
                     for position in range(value.shape[1])]}}
    if isinstance(value, pandas.Series):
        return {SERIES_TAG: {"name": encode_value(value.name, name),
                             "index": _column(value.index, name),
                             "values": _column(value, name)}}
    if isinstance(value, pandas.Index):
        return {INDEX_TAG: _column(value, name)}
    return None


def _column(values: Any, name: str) -> dict[str, Any]:
    """One column (a Series or an Index): its array, or its plain values, and its dtype."""
    pandas = sys.modules["pandas"]
    if isinstance(values, pandas.MultiIndex):
        raise TypeError(f"output variable {name!r} has a MultiIndex; reset_index() first")
    dtype = str(values.dtype)
    if isinstance(values, pandas.RangeIndex):  # the default index, as three numbers
        return {"range": [values.start, values.stop, values.step], "dtype": dtype,
                "name": encode_value(values.name, name)}
    if isinstance(values.dtype, pandas.CategoricalDtype):  # its codes, and every category
        categorical = values.array
        return {"codes": _npy(categorical.codes, name), "ordered": bool(categorical.ordered),
                "categories": _column(categorical.categories, name), "dtype": dtype,
                "name": encode_value(values.name, name)}
    if isinstance(values.dtype, pandas.DatetimeTZDtype):  # as UTC, its zone in the dtype
        values = values.tz_convert(None) if isinstance(values, pandas.Index) else \
            values.dt.tz_convert(None)
    array = values.to_numpy()
    if array.dtype.kind != "O":
        return {"npy": _npy(array, name), "dtype": dtype, "name": encode_value(values.name, name)}
    items = array.tolist()
    strange = next((item for item in items if not isinstance(item, _PLAIN)), None)
    if strange is not None:
        raise TypeError(f"output variable {name!r} has a column of Python objects "
                        f"({type(strange).__name__}); only strings, numbers, booleans and "
                        "None leave a sandbox in a column")
    return {"list": items, "dtype": dtype, "name": encode_value(values.name, name)}


def _npy(array: Any, name: str) -> str:
    numpy = sys.modules["numpy"]
    if array.dtype.fields is not None or array.dtype.kind == "V":
        raise TypeError(f"output variable {name!r} is a structured array; send its fields "
                        "one by one (x['a'])")
    buffer = io.BytesIO()
    try:
        numpy.save(buffer, array, allow_pickle=False)
    except ValueError:
        raise TypeError(f"output variable {name!r} holds an array of Python objects, which "
                        "would need pickle to leave a sandbox; convert it (astype(str), "
                        "tolist())") from None
    return base64.b64encode(buffer.getvalue()).decode("ascii")
