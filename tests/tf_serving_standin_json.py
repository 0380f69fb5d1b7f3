"""JSON as TF Serving reads and writes it, for the stand-in in tf_serving_standin.py: the
rapidjson Reader (kParseNanAndInfFlag) and PrettyWriter that tensorflow/serving 2.15.1's
tensorflow_serving/util/json_tensor.cc uses, where a client can see the difference, and the
errors it builds from them. A rule without a file named comes from json_tensor.cc.
"""

import decimal
import json
import math

import numpy as np
import tensorflow as tf

MISSING = object()  # what JsonObject.find returns for a name the object lacks

# absl::StatusCode names, as absl::Status::ToString() prefixes a message with them.
STATUS_CODE_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}


def invalid_argument(*parts):
    """errors::InvalidArgument(parts...): the parts joined as absl::StrCat joins them."""
    return tf.errors.InvalidArgumentError(None, None, "".join(str(p) for p in parts))


def status_string(error):
    """absl::Status::ToString(), used where TF Serving nests one error inside another."""
    return "%s: %s" % (STATUS_CODE_NAMES.get(error.error_code, "UNKNOWN"), error.message)


def dtype_string(dtype_enum):
    """tensorflow::DataTypeString: numpy-style names except float, double and half."""
    name = tf.dtypes.as_dtype(dtype_enum).name
    return {"float32": "float", "float64": "double", "float16": "half"}.get(name, name)


class JsonObject(list):
    """A JSON object as rapidjson keeps it: members in order, duplicate names kept."""

    def find(self, name):
        """rapidjson's FindMember: the first member of that name."""
        for key, value in self:
            if key == name:
                return value
        return MISSING


class _NumberTooBig(ValueError):
    pass


def _parse_int(text):
    # rapidjson stores an integer beyond uint64's range as a double (reader.h ParseNumber).
    value = int(text)
    return value if -(2**63) <= value < 2**64 else _parse_float(text)


def _parse_float(text):
    value = float(text)
    if math.isinf(value):
        raise _NumberTooBig(text)
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=JsonObject, parse_int=_parse_int, parse_float=_parse_float
)

# rapidjson's GetParseError_En for the errors Python's json module reports differently.
_PARSE_MESSAGES = {
    "Expecting value": "Invalid value.",
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
    "Invalid \\escape": "Invalid escape character in string.",
    "Invalid \\uXXXX escape": "Incorrect hex digit after \\u escape in string.",
    "Invalid control character at": "Invalid encoding in string.",
    "Extra data": "The document root must not be followed by other values.",
}


def _innermost_container(text, pos):
    """'[' or '{' open at pos: Python says "Expecting ',' delimiter" for both, rapidjson not."""
    stack, in_string, escaped = [], False, False
    for ch in text[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else None


def parse_json(body):
    """ParseJson: the request body as one JSON object.

    Differences left: rapidjson also reads "Inf"/"-Inf" (Python only "Infinity"), and its
    error offsets may differ from Python's by a few characters."""
    if not body:
        raise invalid_argument("JSON Parse error: The document is empty")
    # rapidjson does not validate UTF-8: bytes that are not UTF-8 pass into strings as they are.
    text = body.decode("utf-8", "surrogateescape")
    try:
        if not text.strip():
            raise json.JSONDecodeError("The document is empty.", text, len(text))
        doc = _DECODER.decode(text)
    except _NumberTooBig:
        raise invalid_argument(
            "JSON Parse error: Number too big to be stored in double. at offset: 0"
        ) from None
    except json.JSONDecodeError as e:
        message = _PARSE_MESSAGES.get(e.msg, e.msg)
        if e.msg == "Expecting ',' delimiter":
            message = (
                "Missing a comma or ']' after an array element."
                if _innermost_container(text, e.pos) == "["
                else "Missing a comma or '}' after an object member."
            )
        raise invalid_argument("JSON Parse error: %s at offset: %d" % (message, e.pos)) from None
    if not isinstance(doc, JsonObject):
        raise format_error(doc, "Is not object")
    return doc


def json_type(value):
    """JsonTypeString."""
    if value is None:
        return "Null"
    if value is True or value is False:
        return str(value)
    if isinstance(value, JsonObject):
        return "Object"
    if isinstance(value, list):
        return "Array"
    return "String" if isinstance(value, str) else "Number"


def to_bytes(text):
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate written as a \u escape
        return text.encode("utf-8", "surrogatepass")


# ---- Writing: rapidjson's PrettyWriter ----------------------------------------------------------

_ESCAPES = {
    0x08: b"\\b",
    0x09: b"\\t",
    0x0A: b"\\n",
    0x0C: b"\\f",
    0x0D: b"\\r",
    0x22: b'\\"',
    0x5C: b"\\\\",
}


def _quote(data):
    """rapidjson Writer::WriteString: escapes only '"', '\\' and control characters (\\u00XX in
    upper case); other bytes, non-ASCII included, are written as they are."""
    out = bytearray(b'"')
    for byte in data:
        if byte in _ESCAPES:
            out += _ESCAPES[byte]
        elif byte < 0x20:
            out += b"\\u%04X" % byte
        else:
            out.append(byte)
    out += b'"'
    return bytes(out)


class _WriterStopped(Exception):
    """rapidjson's Writer::Double returned false (NaN or infinity), which ends Accept()."""


class PrettyWriter:
    """rapidjson::PrettyWriter with its defaults (4-space indent), including the
    kFormatSingleLineArray switch that MakeRowFormatJsonFromTensors flips mid-document."""

    def __init__(self):
        self.out = bytearray()
        self.single_line_arrays = False
        self._levels = []  # [in_array, values written] for each open container

    def _indent(self):
        return b" " * (4 * len(self._levels))

    def _prefix(self):
        # PrettyWriter::PrettyPrefix: separators and line breaks before every value.
        if not self._levels:
            return
        level = self._levels[-1]
        in_array, count = level
        if in_array:
            if count:
                self.out += b", " if self.single_line_arrays else b","
            if not self.single_line_arrays:
                self.out += b"\n" + self._indent()
        else:
            if count:
                self.out += b",\n" if count % 2 == 0 else b": "
            else:
                self.out += b"\n"
            if count % 2 == 0:
                self.out += self._indent()
        level[1] += 1

    def start_object(self):
        self._prefix()
        self._levels.append([False, 0])
        self.out += b"{"

    def end_object(self):
        if self._levels.pop()[1]:
            self.out += b"\n" + self._indent()
        self.out += b"}"

    def start_array(self):
        self._prefix()
        self._levels.append([True, 0])
        self.out += b"["

    def end_array(self):
        if self._levels.pop()[1] and not self.single_line_arrays:
            self.out += b"\n" + self._indent()
        self.out += b"]"

    def string(self, data):
        self._prefix()
        self.out += _quote(data if isinstance(data, bytes) else to_bytes(data))

    key = string

    def raw(self, text):
        self._prefix()
        self.out += text.encode("ascii")


def decimal_text(value, single_precision):
    """WriteDecimal: absl::StrCat's six significant digits, or max_digits10 (9 for float, 17
    for double) when those do not read back as the same number; ".0" on whole numbers."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    exact = np.float32 if single_precision else np.float64
    text = "%.6g" % value
    if exact(text) != exact(value):
        text = "%.*g" % (9 if single_precision else 17, value)
    if "." not in text and "e" not in text:
        text += ".0"
    return text


def _shortest_double_text(value):
    """rapidjson Writer::Double: the shortest digits that read back (Grisu2; Python's repr
    finds the same), laid out by rapidjson's internal::Prettify."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    parts = decimal.Decimal(repr(abs(value))).normalize().as_tuple()
    digits, k = "".join(map(str, parts.digits)), parts.exponent
    kk = len(digits) + k
    if 0 <= k and kk <= 21:
        body = digits + "0" * k + ".0"
    elif 0 < kk <= 21:
        body = digits[:kk] + "." + digits[kk:]
    elif -6 < kk <= 0:
        body = "0." + "0" * -kk + digits
    elif len(digits) == 1:
        body = "%se%d" % (digits, kk - 1)
    else:
        body = "%s.%se%d" % (digits[0], digits[1:], kk - 1)
    return sign + body


def _accept(writer, value):
    """rapidjson Value::Accept(writer): the document as parsed, written back."""
    if value is None or value is True or value is False:
        writer.raw(json.dumps(value))
    elif isinstance(value, JsonObject):
        writer.start_object()
        for name, member in value:
            writer.key(name)
            _accept(writer, member)
        writer.end_object()
    elif isinstance(value, list):
        writer.start_array()
        for element in value:
            _accept(writer, element)
        writer.end_array()
    elif isinstance(value, str):
        writer.string(value)
    elif isinstance(value, int):
        writer.raw(str(value))
    else:
        if math.isnan(value) or math.isinf(value):
            writer._prefix()  # PrettyPrefix runs before Double() fails
            raise _WriterStopped()
        writer.raw(_shortest_double_text(value))


def value_to_string(value):
    """JsonValueToString (2.15.1): a request value quoted in an error message, untruncated."""
    writer = PrettyWriter()
    if isinstance(value, float):
        # rapidjson's IsFloat() is a range check: such doubles are written as floats.
        writer.raw(decimal_text(value, abs(value) <= 3.4028234e38))
    else:
        try:
            _accept(writer, value)
        except _WriterStopped:
            pass
    return writer.out.decode("utf-8", "surrogateescape")


def format_error(value, *parts):
    """FormatError."""
    return invalid_argument("JSON Value: ", value_to_string(value), " ", *parts)


def status_json(message):
    """MakeJsonFromStatus: {"error": message}."""
    writer = PrettyWriter()
    writer.start_object()
    writer.key(b"error")
    writer.string(message)
    writer.end_object()
    return bytes(writer.out)
