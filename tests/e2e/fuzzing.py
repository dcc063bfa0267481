"""Random protobuf messages for any request type, from its descriptor (hypothesis).

Values lean on what breaks servers: empty and huge strings, odd unicode, control
characters, negative and extreme integers, NaN and infinities, enum numbers no version
defines, deep and repeated nesting.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

INT32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, -1, 1, 2**31 - 1, -(2**31)]))
INT64 = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 2**53, 2**63 - 1]))
UINT64 = st.integers(0, 2**64 - 1)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e308, -1e-308]))
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "../../etc/passwd", "'; DROP TABLE jobs; --", "\x00", "ü" * 200, "a" * 5000, "{}", "[]"]),
)
SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_INT32: INT32, FieldDescriptor.TYPE_SINT32: INT32, FieldDescriptor.TYPE_SFIXED32: INT32,
    FieldDescriptor.TYPE_INT64: INT64, FieldDescriptor.TYPE_SINT64: INT64, FieldDescriptor.TYPE_SFIXED64: INT64,
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1), FieldDescriptor.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: UINT64, FieldDescriptor.TYPE_FIXED64: UINT64,
    FieldDescriptor.TYPE_DOUBLE: FLOATS, FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True),
    FieldDescriptor.TYPE_BOOL: st.booleans(), FieldDescriptor.TYPE_STRING: TEXT,
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=64),
}


@st.composite
def messages(draw: st.DrawFn, cls: type[Message], depth: int = 0) -> Message:
    msg = cls()
    fill(draw, msg, msg.DESCRIPTOR, depth)
    return msg


def fill(draw: st.DrawFn, msg: Message, desc: Descriptor, depth: int) -> None:
    for field in desc.fields:
        if not draw(st.booleans()):
            continue  # most fields are left unset, as most real requests leave them
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _fill_map(draw, getattr(msg, field.name), field, depth)
        elif field.is_repeated:
            for _ in range(draw(st.integers(0, 3))):
                if field.message_type is not None:
                    if depth < 3 and not _is_well_known(field.message_type):
                        fill(draw, getattr(msg, field.name).add(), field.message_type, depth + 1)
                else:
                    getattr(msg, field.name).append(draw(_scalar(field)))
        elif field.message_type is not None:
            if depth < 3 and not _is_well_known(field.message_type):
                fill(draw, getattr(msg, field.name), field.message_type, depth + 1)
        else:
            setattr(msg, field.name, draw(_scalar(field)))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-5, 50))
    return SCALARS[field.type]


def _fill_map(draw: st.DrawFn, target: Any, field: FieldDescriptor, depth: int) -> None:
    key_field = field.message_type.fields_by_name["key"]
    value_field = field.message_type.fields_by_name["value"]
    for _ in range(draw(st.integers(0, 3))):
        key = draw(_scalar(key_field))
        if value_field.message_type is not None:
            if depth < 3:
                fill(draw, target[key], value_field.message_type, depth + 1)
        else:
            target[key] = draw(_scalar(value_field))


def _is_well_known(desc: Descriptor) -> bool:
    # Struct/Value/Timestamp carry their own validity rules in the runtime; leave them out.
    return desc.full_name.startswith("google.protobuf.")
