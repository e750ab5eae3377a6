"""The kernel's side of `child/array_values.py`: numpy arrays and pandas values a cell sends
back as output variables, read from data only.

Everything here came from the sandbox: an `.npy` is loaded with `allow_pickle=False` (numpy
reads its header as a literal, never as code, and refuses object arrays), a column's plain
values must be strings, numbers, booleans or None, a dtype is a name pandas parses (or it is
left as read). Whatever does not fit raises ValueError, which ends the cell as a malformed
report; it never runs or imports anything the sandbox chose.
"""

from __future__ import annotations

import base64
import io
import time
from typing import Any

from ..wire import ARRAY_TAG, FRAME_TAG, INDEX_TAG, MAX_VARIABLES_BYTES, SERIES_TAG
from .crossing_text import valid_unicode, variable_value

__all__ = ["decode_array_value"]

_PLAIN = (str, int, float, bool, type(None))
_deadline = 0.0  # of the value being read (the control channel reads one frame at a time)


# What one output variable may cost the kernel to read: elements (a value of the frame's
# size has far fewer, unless its items take no bytes) and time (tens of thousands of tiny
# columns take seconds each thousand). Past either, the value is malformed.
MAX_ELEMENTS = MAX_VARIABLES_BYTES * 8
READ_SECONDS = 10.0
_MAX_ITEMSIZE = 1 << 16  # a dtype name asking for wider items than any value carries


def decode_array_value(tag: str, content: Any) -> Any:
    """The value a tag and its content stand for (ValueError if they are not well formed,
    whatever numpy or pandas raised on the way)."""
    global _deadline
    _deadline = time.monotonic() + READ_SECONDS
    try:
        return _decode(tag, content)
    except (ValueError, RecursionError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - hostile data: any failure is a malformed value
        raise ValueError(f"not a well-formed {tag}: {type(exc).__name__}") from None


def _decode(tag: str, content: Any) -> Any:
    if tag == ARRAY_TAG:
        return _array(content)
    pandas = _pandas()
    if tag == INDEX_TAG:
        return _index(content)
    fields = _fields(content, {"name", "index", "values"} if tag == SERIES_TAG
                     else {"columns", "index", "data"})
    index = _index(fields["index"])
    if tag == SERIES_TAG:
        values = _values(fields["values"]).array
        if len(values) != len(index):
            raise ValueError("a Series is as long as its index")
        return pandas.Series(values, index=index, name=_label(fields["name"]))
    if tag != FRAME_TAG:
        raise ValueError(f"unknown tag {tag!r}")
    columns, data = fields["columns"], fields["data"]
    if not isinstance(columns, list) or not isinstance(data, list) or len(columns) != len(data):
        raise ValueError("a DataFrame needs as many columns as names")
    arrays = [_values(column).array for column in data]
    if any(len(array) != len(index) for array in arrays):
        raise ValueError("a DataFrame's columns are as long as its index")
    frame = pandas.DataFrame(dict(enumerate(arrays)), index=index)
    frame.columns = pandas.Index([_label(label) for label in columns], tupleize_cols=False)
    return frame


def _pandas() -> Any:
    import pandas  # the sandbox made one, so the kernel's environment has pandas

    return pandas


def _fields(content: Any, names: set[str]) -> dict[str, Any]:
    if not isinstance(content, dict) or set(content) != names:
        raise ValueError(f"expected the fields {sorted(names)}")
    return content


def _array(content: Any) -> Any:
    import numpy

    if not isinstance(content, str):
        raise ValueError("an array must be .npy bytes in base64")
    raw = base64.b64decode(content, validate=True)
    try:
        array = numpy.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError, TypeError, SyntaxError) as exc:
        raise ValueError(f"not an .npy array: {type(exc).__name__}") from None
    if not isinstance(array, numpy.ndarray):
        raise ValueError("not an .npy array")
    if array.size > MAX_ELEMENTS or (array.dtype.itemsize == 0 and array.size):
        raise ValueError("an array of more items than its bytes could carry")
    if array.dtype.fields is not None or array.dtype.kind == "V":
        raise ValueError("a structured array (the child sends none)")
    if array.dtype.kind == "U":  # lone surrogates would break the kernel's messages
        cleaned = [valid_unicode(item) for item in array.ravel().tolist()]
        array = numpy.array(cleaned, dtype=array.dtype).reshape(array.shape)
    return array


def _index(column: Any) -> Any:
    """An index: the default range as its three numbers, any other as its values."""
    pandas = _pandas()
    if isinstance(column, dict) and set(column) == {"range", "dtype", "name"}:
        bounds = column["range"]
        if not (isinstance(bounds, list) and len(bounds) == 3
                and all(type(number) is int for number in bounds)):
            raise ValueError("a range index is three integers")
        return pandas.RangeIndex(*bounds, name=_name(column))
    return pandas.Index(_values(column).array, name=_name(column), tupleize_cols=False)


def _values(column: Any) -> Any:
    """A column's values with its dtype as the sandbox named it (when pandas knows it), as
    a Series on a plain range (callers take its `.array`: no alignment on an index)."""
    if time.monotonic() > _deadline:
        raise ValueError(f"it took more than {READ_SECONDS:g} s to read")
    if not isinstance(column, dict) or not {"dtype", "name"} <= set(column) \
            or not isinstance(column["dtype"], str):
        raise ValueError("a column needs its values, its dtype and its name")
    pandas = _pandas()
    if set(column) == {"codes", "ordered", "categories", "dtype", "name"}:
        codes = _array(column["codes"])
        if codes.dtype.kind != "i" or codes.ndim != 1 or not isinstance(column["ordered"], bool):
            raise ValueError("a categorical column needs integer codes")
        return pandas.Series(pandas.Categorical.from_codes(
            codes, categories=_values(column["categories"]).array, ordered=column["ordered"]))
    if len(column) != 3:
        raise ValueError("a column is its values, its dtype and its name")
    if "npy" in column:
        values = pandas.Series(_array(column["npy"]))
    elif "list" in column and isinstance(column["list"], list):
        items = column["list"]
        if not all(isinstance(item, _PLAIN) for item in items):
            raise ValueError("a column's plain values are strings, numbers, booleans or None")
        values = pandas.Series(variable_value(items), dtype=object)
    else:
        raise ValueError("a column is an .npy array or a list of plain values")
    return _as_dtype(values, column["dtype"][:200])


def _as_dtype(values: Any, name: str) -> Any:
    pandas = _pandas()
    try:
        dtype = pandas.api.types.pandas_dtype(name)
    except (TypeError, ValueError):
        return values  # a dtype this pandas does not know: the values as read
    if dtype == values.dtype or getattr(dtype, "itemsize", 0) > _MAX_ITEMSIZE:
        return values
    try:
        if isinstance(dtype, pandas.DatetimeTZDtype):  # sent as UTC
            return values.dt.tz_localize("UTC").dt.tz_convert(dtype.tz)
        return values.astype(dtype)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return values


def _name(column: Any) -> Any:
    return _label(column.get("name")) if isinstance(column, dict) else None


def _label(label: Any) -> Any:
    """A column or index name: plain data only."""
    if isinstance(label, list):
        return tuple(_label(item) for item in label)
    if not isinstance(label, _PLAIN):
        raise ValueError("a name is a string, a number or None")
    return variable_value(label)
