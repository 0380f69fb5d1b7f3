"""TF Serving's JSON <-> tensor rules, for the stand-in in tf_serving_standin.py: the tensors of
a REST Predict request read from its body, and the response's tensors written as JSON, as
tensorflow/serving 2.15.1 does it. Each rule names its function of
tensorflow_serving/util/json_tensor.cc at that tag.
"""

import base64
import binascii

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tf_serving_standin_json import (
    MISSING,
    JsonObject,
    PrettyWriter,
    decimal_text,
    dtype_string,
    format_error,
    invalid_argument,
    json_type,
    parse_json,
    status_string,
    to_bytes,
    value_to_string,
)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer_in(value, low, high):
    """rapidjson's IsInt/IsUint/IsInt64/IsUint64: an integer token within [low, high)."""
    return type(value) is int and low <= value < high


def _type_error(value, dtype):
    """TypeError."""
    return invalid_argument(
        "JSON Value: ",
        value_to_string(value),
        " Type: ",
        json_type(value),
        " is not of expected type: ",
        dtype_string(dtype),
    )


def _add_value(value, dtype, tensor):
    """AddValueToTensor: which JSON values each dtype takes (a number with a fraction or an
    exponent is no integer), into the TensorProto field TF keeps that dtype in."""
    if dtype in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE):
        if not _is_number(value):
            raise _type_error(value, dtype)
        if dtype == types_pb2.DT_FLOAT:
            with np.errstate(over="ignore"):  # GetFloat() is a plain cast: too big is inf
                tensor.float_val.append(float(np.float32(value)))
        else:
            tensor.double_val.append(float(value))
    elif dtype in (types_pb2.DT_INT32, types_pb2.DT_INT16, types_pb2.DT_INT8, types_pb2.DT_UINT8):
        if not _is_integer_in(value, -(2**31), 2**31):
            raise _type_error(value, dtype)
        tensor.int_val.append(value)
    elif dtype == types_pb2.DT_STRING:
        if not isinstance(value, str):
            raise _type_error(value, dtype)
        tensor.string_val.append(to_bytes(value))
    elif dtype == types_pb2.DT_INT64:
        if not _is_integer_in(value, -(2**63), 2**63):
            raise _type_error(value, dtype)
        tensor.int64_val.append(value)
    elif dtype == types_pb2.DT_BOOL:
        if value is not True and value is not False:
            raise _type_error(value, dtype)
        tensor.bool_val.append(value)
    elif dtype == types_pb2.DT_UINT32:
        if not _is_integer_in(value, 0, 2**32):
            raise _type_error(value, dtype)
        tensor.uint32_val.append(value)
    elif dtype == types_pb2.DT_UINT64:
        if not _is_integer_in(value, 0, 2**64):
            raise _type_error(value, dtype)
        tensor.uint64_val.append(value)
    else:
        raise tf.errors.UnimplementedError(
            None,
            None,
            "Conversion of JSON Value: %s to type: %s"
            % (value_to_string(value), dtype_string(dtype)),
        )


def _dense_shape(value, shape):
    """GetDenseTensorShape: the sizes of the first element at each level."""
    while isinstance(value, list) and not isinstance(value, JsonObject):
        shape.dim.add(size=len(value))
        if not value:
            break
        value = value[0]


def is_base64_object(value):
    """IsValBase64Object: {"b64": "<string>"} and nothing else."""
    return isinstance(value, JsonObject) and len(value) == 1 and isinstance(value.find("b64"), str)


def decode_base64_object(value):
    """JsonDecodeBase64Object (absl::Base64Unescape: standard alphabet, padding optional)."""
    if not is_base64_object(value):
        raise invalid_argument(
            "JSON Value: ", value_to_string(value), " not formatted correctly for base64 data"
        )
    text = value.find("b64")
    try:
        if len(text) % 4 == 1:
            raise ValueError(text)
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (ValueError, binascii.Error):
        raise invalid_argument("Unable to base64 decode") from None


def _is_list(value):
    return isinstance(value, list) and not isinstance(value, JsonObject)


def _fill_tensor(value, level, dtype, tensor):
    """FillTensorProto: values only at the leaves, lists as long as the first one of their
    level; returns the number of values added."""
    rank = len(tensor.tensor_shape.dim)
    if not _is_list(value):
        if level != rank:
            raise invalid_argument(
                "JSON Value: ",
                value_to_string(value),
                " found at incorrect level: ",
                level + 1,
                " in the JSON DOM. Expected at level: ",
                rank,
            )
        if isinstance(value, JsonObject):
            if dtype != types_pb2.DT_STRING:
                raise _type_error(value, dtype)
            tensor.string_val.append(decode_base64_object(value))
        else:
            _add_value(value, dtype, tensor)
        return 1
    if level >= rank:
        raise invalid_argument(
            "Encountered list at unexpected level: ", level, " expected < ", rank
        )
    expected = tensor.tensor_shape.dim[level].size
    if len(value) != expected:
        raise invalid_argument(
            "Encountered list at unexpected size: ",
            len(value),
            " at level: ",
            level,
            " expected size: ",
            expected,
        )
    return sum(_fill_tensor(v, level + 1, dtype, tensor) for v in value)


def _shape_string(shape):
    """ShapeToString."""
    return "[?]" if shape.unknown_rank else "[%s]" % ",".join(str(d.size) for d in shape.dim)


def _add_instance_item(item, name, input_infos, sizes, shapes, tensors):
    """AddInstanceItem: one value of one instance, appended to its input's tensor."""
    if name not in input_infos:
        raise invalid_argument("JSON object: does not have named input: ", name)
    tensor = tensors[name]
    tensor.tensor_shape.Clear()
    _dense_shape(item, tensor.tensor_shape)
    size = _fill_tensor(item, 0, input_infos[name].dtype, tensor)
    if name not in sizes:
        sizes[name] = size
        shapes[name] = [d.size for d in tensor.tensor_shape.dim]
    elif sizes[name] != size:
        raise invalid_argument("Expecting tensor size: ", sizes[name], " but got: ", size)
    elif shapes[name] != [d.size for d in tensor.tensor_shape.dim]:
        raise invalid_argument(
            "Expecting shape ",
            "[%s]" % ",".join(map(str, shapes[name])),
            " but got: ",
            _shape_string(tensor.tensor_shape),
        )


def _fill_from_instances(instances, input_infos, tensors):
    """FillTensorMapFromInstancesList: the row format. Each instance is one value (one input)
    or an object with exactly the signature's inputs; they are stacked on a new 0th dimension.

    input_infos.begin() of TF Serving's protobuf map is unordered; with one input (the only
    case where it matters) the sorted first name is the same name."""
    first_name = sorted(input_infos)[0]
    if not isinstance(instances[0], JsonObject) and len(input_infos) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as "
            "multiple input tensors required as per tensorinfo_map"
        )

    def is_element_object(value):
        return isinstance(value, JsonObject) and not is_base64_object(value)

    objects = is_element_object(instances[0])
    input_names = sorted(input_infos)
    sizes, shapes = {}, {}
    for count, element in enumerate(instances):
        if objects:
            if not is_element_object(element):
                raise invalid_argument(
                    "Expecting object but got list at item ", count, " of input list"
                )
            for name, item in element:
                try:
                    _add_instance_item(item, name, input_infos, sizes, shapes, tensors)
                except tf.errors.OpError as e:
                    raise invalid_argument(
                        "Failed to process element: ",
                        count,
                        " key: ",
                        name,
                        " of 'instances' list. Error: ",
                        status_string(e),
                    ) from None
            if sorted({name for name, _ in element}) != input_names:
                raise invalid_argument(
                    "Failed to process element: ",
                    count,
                    " of 'instances' list. JSON object: ",
                    value_to_string(element),
                    " keys must be equal to: ",
                    ",".join(input_names),
                )
        else:
            if is_element_object(element):
                raise invalid_argument(
                    "Expecting value/list but got object at item ", count, " of input list"
                )
            try:
                _add_instance_item(element, first_name, input_infos, sizes, shapes, tensors)
            except tf.errors.OpError as e:
                raise invalid_argument(
                    "Failed to process element: ",
                    count,
                    " of 'instances' list. Error: ",
                    status_string(e),
                ) from None
    for name in tensors:
        tensor = tensors[name]
        tensor.dtype = input_infos[name].dtype
        tensor.tensor_shape.Clear()
        tensor.tensor_shape.dim.add(size=len(instances))
        for size in shapes[name]:
            tensor.tensor_shape.dim.add(size=size)


def _fill_from_inputs(inputs, input_infos, tensors):
    """FillTensorMapFromInputsMap: the columnar format. A plain value or list for a signature
    of one input, else an object naming every input; members that name no input are ignored."""
    if not isinstance(inputs, JsonObject) or is_base64_object(inputs):
        if len(input_infos) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as "
                "multiple input tensors required as per tensorinfo_map"
            )
        named = [(sorted(input_infos)[0], inputs)]
    else:
        named = []
        for name in sorted(input_infos):
            value = inputs.find(name)
            if value is MISSING:
                raise invalid_argument("Missing named input: ", name, " in 'inputs' object.")
            named.append((name, value))
    for name, value in named:
        tensor = tensors[name]
        tensor.dtype = input_infos[name].dtype
        tensor.tensor_shape.Clear()
        _dense_shape(value, tensor.tensor_shape)
        _fill_tensor(value, 0, tensor.dtype, tensor)


def fill_signature_name(doc, model_spec):
    """FillSignature: the optional "signature_name", which must be a string."""
    name = doc.find("signature_name")
    if name is MISSING:
        return
    if not isinstance(name, str):
        raise invalid_argument(
            "JSON Value: ",
            value_to_string(doc),
            " not formatted correctly. 'signature_name' key must be a string value.",
        )
    model_spec.signature_name = name


def fill_predict_request(body, input_infos_of, request):
    """FillPredictRequestFromJson: fills request.inputs from the body; returns "row" for
    "instances" or "columnar" for "inputs". input_infos_of(signature_name) is
    HttpRestApiHandler::GetInfoMap (model lookup, then the signature's inputs)."""
    doc = parse_json(body)
    fill_signature_name(doc, request.model_spec)
    signature_name = request.model_spec.signature_name
    input_infos = input_infos_of(signature_name)
    if not input_infos:
        raise invalid_argument(
            "Failed to get input map for signature: ", signature_name or "DEFAULT"
        )
    instances, inputs = doc.find("instances"), doc.find("inputs")
    if instances is not MISSING:
        if inputs is not MISSING:
            raise format_error(
                doc,
                "Not formatted correctly expecting only one of 'inputs' or "
                "'instances' keys to exist ",
            )
        if not _is_list(instances):
            raise format_error(doc, "Expecting 'instances' to be an list/array")
        if not instances:
            raise format_error(doc, "No values in 'instances' array")
        _fill_from_instances(instances, input_infos, request.inputs)
        return "row"
    if inputs is not MISSING:
        _fill_from_inputs(inputs, input_infos, request.inputs)
        return "columnar"
    raise invalid_argument("Missing 'inputs' or 'instances' key")


# ---- Reading a Classify or Regress request ------------------------------------------------------


def _check_feature_value(value, name, kind):
    """AddValueToFeature: returns the feature's kind after this value."""

    def incompatible():
        return invalid_argument(
            "Unexpected element type in feature: ", name, " expecting type: ", kind
        )

    def unexpected():
        return invalid_argument(
            "Feature: ", name, " has element with unexpected JSON type: ", json_type(value)
        )

    if value is None or _is_list(value):
        raise unexpected()
    if value is True or value is False:
        new_kind = "int64"
    elif isinstance(value, JsonObject):
        if not is_base64_object(value):
            raise unexpected()
        new_kind = "bytes"
    elif isinstance(value, str):
        new_kind = "bytes"
    elif isinstance(value, float):
        new_kind = "float"
    else:
        new_kind = "int64"
    if kind not in ("UNKNOWN", new_kind):
        raise incompatible()
    if isinstance(value, JsonObject):
        decode_base64_object(value)
    if new_kind == "int64" and type(value) is int and value >= 2**63:
        raise invalid_argument(
            "Feature: ", name, " has uint64_t element. Only int64_t is supported."
        )
    return new_kind


def _check_example(value):
    """MakeExampleFromJsonObject."""
    if not isinstance(value, JsonObject):
        raise invalid_argument("Example must be JSON object but got JSON ", json_type(value))
    for name, content in value:
        kind = "UNKNOWN"
        for element in content if _is_list(content) else [content]:
            kind = _check_feature_value(element, name, kind)


def check_classify_regress_request(body, model_spec):
    """FillClassifyRegressRequestFromJson, for its refusals (the stand-in builds no Examples).
    Its message says "classify" for :regress too."""
    doc = parse_json(body)
    fill_signature_name(doc, model_spec)
    context = doc.find("context")
    if context is not MISSING:
        _check_example(context)
    examples = doc.find("examples")
    if examples is MISSING:
        raise format_error(
            doc, "When method is classify, key 'examples' is expected and was not found"
        )
    if not _is_list(examples):
        raise format_error(doc, "Expecting 'examples' value to be an list/array")
    if not examples:
        raise format_error(doc, "'examples' value is an empty array")
    for example in examples:
        _check_example(example)


# ---- Writing a Predict response -----------------------------------------------------------------


def _proto_values(tensor):
    """The TensorProto field AddSingleValueAndAdvance reads for the dtype, and how it writes
    one value; None for dtypes it cannot write."""
    dtype = tensor.dtype
    if dtype == types_pb2.DT_FLOAT:
        return tensor.float_val, lambda w, v: w.raw(decimal_text(v, True))
    if dtype == types_pb2.DT_DOUBLE:
        return tensor.double_val, lambda w, v: w.raw(decimal_text(v, False))
    if dtype in (types_pb2.DT_INT32, types_pb2.DT_INT16, types_pb2.DT_INT8, types_pb2.DT_UINT8):
        return tensor.int_val, lambda w, v: w.raw(str(v))
    if dtype == types_pb2.DT_INT64:
        return tensor.int64_val, lambda w, v: w.raw(str(v))
    if dtype == types_pb2.DT_UINT32:
        return tensor.uint32_val, lambda w, v: w.raw(str(v))
    if dtype == types_pb2.DT_UINT64:
        return tensor.uint64_val, lambda w, v: w.raw(str(v))
    if dtype == types_pb2.DT_BOOL:
        return tensor.bool_val, lambda w, v: w.raw("true" if v else "false")
    if dtype == types_pb2.DT_STRING:
        return tensor.string_val, None  # written by _write_value: plain or base64
    return None, None


def _write_value(writer, name, tensor, offset):
    """AddSingleValueAndAdvance: a string output whose name ends in "_bytes" is written as
    {"b64": ...} (IsNamedTensorBytes); dtypes without a case (half, bfloat16, uint16, complex)
    are refused, but only once a value of them is written."""
    values, write = _proto_values(tensor)
    if values is None:
        raise invalid_argument(
            "Failed to write JSON value for tensor type: ", dtype_string(tensor.dtype)
        )
    value = values[offset[0]]
    if tensor.dtype == types_pb2.DT_STRING:
        if name.endswith("_bytes"):
            writer.start_object()
            writer.key(b"b64")
            writer.string(base64.b64encode(value))
            writer.end_object()
        else:
            writer.string(value)
    else:
        write(writer, value)
    offset[0] += 1


def _write_tensor_values(writer, name, tensor, dim, offset):
    """AddTensorValues: nested lists from dimension `dim` on; a scalar as a bare value."""
    dims = [d.size for d in tensor.tensor_shape.dim]
    if dim > len(dims) - 1:
        _write_value(writer, name, tensor, offset)
        return
    writer.start_array()
    for _ in range(dims[dim]):
        if dim == len(dims) - 1:
            _write_value(writer, name, tensor, offset)
        else:
            _write_tensor_values(writer, name, tensor, dim + 1, offset)
    writer.end_array()


def predict_response_json(outputs, request_format):
    """MakeJsonFromTensors: {"predictions": [...]} for the row format, {"outputs": ...} for the
    columnar one; outputs are keyed by name only when there are several. The protobuf map's
    order is unspecified in TF Serving; here names are sorted."""
    if not outputs:
        raise invalid_argument("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    writer = PrettyWriter()
    writer.start_object()
    several = len(names) > 1
    if request_format == "row":
        # MakeRowFormatJsonFromTensors: every output needs the same 0th (batch) dimension.
        batch_size = -1
        for name in names:
            dims = outputs[name].tensor_shape.dim
            if not dims:
                raise invalid_argument("Tensor name: ", name, " has no shape information ")
            if batch_size >= 0 and batch_size != dims[0].size:
                raise invalid_argument(
                    "Tensor name: ",
                    name,
                    " has inconsistent batch size: ",
                    dims[0].size,
                    " expecting: ",
                    batch_size,
                )
            batch_size = dims[0].size
        offsets = {name: [0] for name in names}
        writer.key(b"predictions")
        writer.start_array()
        for _ in range(batch_size):
            if several:
                writer.start_object()
            writer.single_line_arrays = True
            for name in names:
                if several:
                    writer.key(name)
                _write_tensor_values(writer, name, outputs[name], 1, offsets[name])
            writer.single_line_arrays = False
            if several:
                writer.end_object()
        writer.end_array()
    else:
        # MakeColumnarFormatJsonFromTensors.
        writer.key(b"outputs")
        if several:
            writer.start_object()
        for name in names:
            if several:
                writer.key(name)
            _write_tensor_values(writer, name, outputs[name], 0, [0])
        if several:
            writer.end_object()
    writer.end_object()
    return bytes(writer.out)
