"""TFServingStandIn (tf_serving_standin.py) refuses what TensorFlow Serving 2.15.1 refuses and
answers as it answers, over REST and gRPC, for a tiny SavedModel. Expected messages are TF
Serving's own (the stand-in cites where each comes from)."""

import base64
import gzip
import json
import socket
import threading
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf

# The venv has tensorflow-serving-api (the Makefile's venv-requirements installs it).
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
)

from tf_serving_standin import TFServingStandIn

_INFO = tf.compat.v1.saved_model.utils.build_tensor_info


def _signature(inputs, outputs):
    return tf.compat.v1.saved_model.signature_def_utils.build_signature_def(
        {k: _INFO(v) for k, v in inputs.items()},
        {k: _INFO(v) for k, v in outputs.items()},
        "tensorflow/serving/predict",
    )


def _export(export_dir):
    """A model with a restored variable (scale = 3), a table its main op fills (2 entries), and
    one signature per case under test."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        word = tf.compat.v1.placeholder(tf.string, [], name="word")
        scale = tf.compat.v1.get_variable("scale", initializer=3.0)
        table = tf.compat.v1.lookup.StaticHashTable(
            tf.compat.v1.lookup.KeyValueTensorInitializer(
                tf.constant(["a", "b"]), tf.constant([1, 2], tf.int64)
            ),
            -1,
        )
        greeting = tf.strings.join(["hello ", word])
        signatures = {
            "serving_default": _signature(
                {"x": x, "ids": ids}, {"sum": tf.reduce_sum(x, 1) * scale, "big": ids + 2**53}
            ),
            "one_output": _signature({"x": x}, {"y": x * scale}),
            "no_inputs": _signature({}, {"size": tf.reshape(table.size(), [1])}),
            "strings": _signature(
                {"word": word}, {"greeting": greeting, "greeting_bytes": greeting}
            ),
            "totals": _signature({"x": x}, {"rows": tf.identity(x), "total": tf.reduce_sum(x)}),
            "uneven": _signature({"x": x}, {"rows": tf.identity(x), "head": x[:1]}),
            "echo": _signature({"x": x}, {"x_again": x}),
        }
        sess.run(tf.compat.v1.global_variables_initializer())
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        builder.add_meta_graph_and_variables(
            sess, ["serve"], signature_def_map=signatures, main_op=tf.compat.v1.tables_initializer()
        )
        builder.save()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    export_dir = str(tmp_path_factory.mktemp("standin") / "export")
    _export(export_dir)
    with TFServingStandIn(export_dir, name="m", labels={"stable": 1}) as server:
        yield server


@pytest.fixture(scope="module")
def stub(served):
    with grpc.insecure_channel(served.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _http(url, body=None, method=None, headers=None):
    """(HTTP status, response body bytes)."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def _rest(url, body=None, method=None):
    """(HTTP status, response JSON)."""
    status, data = _http(url, body, method)
    return status, json.loads(data)


def _rest_error(url, body=None, method=None):
    status, answer = _rest(url, body, method)
    assert list(answer) == ["error"], answer
    return status, answer["error"]


def _predict_request(signature="", **inputs):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.model_spec.signature_name = signature
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    return request


def _grpc_error(call, request):
    with pytest.raises(grpc.RpcError) as raised:
        call(request, timeout=60)
    return raised.value.code(), raised.value.details()


def test_a_signature_without_inputs_is_refused_over_rest_but_runs_over_grpc(served, stub):
    """json_tensor.cc refuses an empty input map before reading the body's tensors;
    predict_util.cc compares input counts (0 == 0) and runs the session."""
    for body in (
        {"signature_name": "no_inputs", "inputs": {}},
        {"signature_name": "no_inputs", "instances": [{}]},
    ):
        assert _rest_error(served.rest_url + ":predict", body) == (
            400,
            "Failed to get input map for signature: no_inputs",
        )
    response = stub.Predict(_predict_request("no_inputs"), timeout=60)
    assert tf.make_ndarray(response.outputs["size"]).tolist() == [2]  # the main op ran


def test_inputs_must_match_the_signature(served, stub):
    url = served.rest_url + ":predict"
    assert _rest_error(url, {"inputs": {"x": [[1, 2]]}}) == (
        400,
        "Missing named input: ids in 'inputs' object.",
    )
    # The columnar format reads only the signature's inputs: other members are ignored.
    assert _rest(url, {"inputs": {"x": [[1, 2]], "ids": [1], "extra": [0]}})[0] == 200
    assert _rest_error(url, {"instances": [{"x": [1, 2], "ids": 1, "extra": 0}]}) == (
        400,
        "Failed to process element: 0 key: extra of 'instances' list. Error: "
        "INVALID_ARGUMENT: JSON object: does not have named input: extra",
    )
    status, message = _rest_error(url, {"instances": [{"x": [1, 2]}]})
    assert status == 400 and message.endswith(" keys must be equal to: ids,x")
    assert _rest_error(url, {"instances": [[1, 2]]}) == (
        400,
        "instances is a plain list, but expecting list of objects as multiple input "
        "tensors required as per tensorinfo_map",
    )

    x, ids = np.ones([1, 2], np.float32), np.ones([1], np.int64)
    assert _grpc_error(stub.Predict, _predict_request(x=x)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "input size does not match signature: 1!=2 len({x}) "
        "!= len({ids,x}). Sent extra: {}. Missing but required: {ids}.",
    )
    assert _grpc_error(stub.Predict, _predict_request(x=x, ids=ids, extra=ids)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "input size does not match signature: 3!=2 "
        "len({extra,ids,x}) != len({ids,x}). Sent extra: {extra}. Missing but required: {}.",
    )
    assert _grpc_error(stub.Predict, _predict_request(x=x, idz=ids)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "Signature input alias: ids(feed name: ids:0) not "
        "found in request and no default value provided. Inputs expected to be in the request "
        "{idz,x}, or default input alias set: ",
    )


def test_an_unknown_signature_is_refused(served, stub):
    url = served.rest_url + ":predict"
    assert _rest_error(url, {"signature_name": "nope", "inputs": [1]}) == (
        400,
        'Serving signature name: "nope" not found in signature def',
    )
    status, message = _rest_error(url, {"signature_name": 7, "inputs": [1]})
    assert status == 400 and message.endswith(
        " not formatted correctly. 'signature_name' key must be a string value."
    )
    assert _grpc_error(stub.Predict, _predict_request("nope")) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        'Serving signature key "nope" not found.',
    )


def test_row_and_columnar_formats(served):
    """ "instances" answers "predictions", one entry per row; "inputs" answers "outputs", one
    entry per output. int64 outputs are JSON integers, past 2**53 too."""
    url = served.rest_url + ":predict"
    status, data = _http(url, {"instances": [{"x": [1, 2], "ids": 1}, {"x": [0.1, 0], "ids": 2}]})
    assert status == 200 and b'"sum": 0.3' in data  # six digits, as float32 reads them back
    assert json.loads(data) == {
        "predictions": [{"big": 2**53 + 1, "sum": 9.0}, {"big": 2**53 + 2, "sum": 0.3}]
    }
    assert _rest(url, {"inputs": {"x": [[1, 2], [0.1, 0]], "ids": [1, 2]}}) == (
        200,
        {"outputs": {"big": [2**53 + 1, 2**53 + 2], "sum": [9.0, 0.3]}},
    )


def test_one_output_is_written_without_its_name(served):
    url = served.rest_url + ":predict"
    status, data = _http(url, {"signature_name": "one_output", "inputs": [[1, float("nan")]]})
    assert status == 200 and b"3.0" in data and b"NaN" in data  # whole floats keep ".0"
    assert json.loads(data, parse_constant=str) == {"outputs": [[3.0, "NaN"]]}
    assert _rest(url, {"signature_name": "one_output", "instances": [[1, 2], [3, 4]]}) == (
        200,
        {"predictions": [[3.0, 6.0], [9.0, 12.0]]},
    )


def test_a_scalar_string_input_and_string_outputs(served):
    """A plain value feeds a scalar; string outputs are JSON strings, base64 objects when the
    output's name ends in "_bytes"; {"b64": ...} feeds bytes."""
    url = served.rest_url + ":predict"
    assert _rest(url, {"signature_name": "strings", "inputs": "world"}) == (
        200,
        {
            "outputs": {
                "greeting": "hello world",
                "greeting_bytes": {"b64": base64.b64encode(b"hello world").decode()},
            }
        },
    )
    status, data = _http(
        url,
        {"signature_name": "strings", "inputs": {"b64": base64.b64encode(b"\xff\x00").decode()}},
    )
    # Bytes are written as they are: not UTF-8, so only the "_bytes" output is usable JSON.
    assert status == 200 and b'"hello \xff\\u0000"' in data
    assert (
        base64.b64decode(json.loads(data.decode("latin-1"))["outputs"]["greeting_bytes"]["b64"])
        == b"hello \xff\x00"
    )
    # TF Serving does not check a feed's shape against the placeholder's: rows feed a scalar.
    status, answer = _rest(url, {"signature_name": "strings", "instances": ["a", "b"]})
    assert status == 200
    assert [row["greeting"] for row in answer["predictions"]] == ["hello a", "hello b"]


def test_row_format_needs_outputs_with_one_batch_dimension(served):
    url = served.rest_url + ":predict"
    assert _rest_error(url, {"signature_name": "totals", "instances": [[1, 2], [3, 4]]}) == (
        400,
        "Tensor name: total has no shape information ",
    )
    assert _rest(url, {"signature_name": "totals", "inputs": [[1, 2], [3, 4]]}) == (
        200,
        {"outputs": {"rows": [[1.0, 2.0], [3.0, 4.0]], "total": 10.0}},
    )
    status, message = _rest_error(url, {"signature_name": "uneven", "instances": [[1, 2], [3, 4]]})
    assert status == 400 and "has inconsistent batch size" in message


def test_an_output_that_is_an_input_fails_in_the_session(served):
    """TF's own graph rewrite (subgraph.cc RewriteGraphForExecution), as under TF Serving."""
    assert _rest_error(
        served.rest_url + ":predict", {"signature_name": "echo", "inputs": [[1, 2]]}
    ) == (400, "x:0 is both fed and fetched.")


def test_model_status_and_metadata(served, stub):
    assert _rest(served.rest_url) == (
        200,
        {
            "model_version_status": [
                {
                    "version": "1",
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ]
        },
    )
    assert _rest_error(served.rest_url + "/versions/2") == (
        404,
        "Could not find version 2 of model m",
    )
    base = served.rest_url[: -len("/m")]
    assert _rest_error(base + "/other") == (404, "Could not find any versions of model other")
    assert _rest_error(base) == (400, "Missing model name in request.")

    status, metadata = _rest(served.rest_url + "/metadata")
    assert status == 200
    assert metadata["model_spec"] == {"name": "m", "signature_name": "", "version": "1"}
    signatures = metadata["metadata"]["signature_def"]["signature_def"]
    assert sorted(signatures) == [
        "echo",
        "no_inputs",
        "one_output",
        "serving_default",
        "strings",
        "totals",
        "uneven",
    ]
    assert signatures["serving_default"]["inputs"]["x"] == {
        "name": "x:0",
        "dtype": "DT_FLOAT",
        "tensor_shape": {
            "dim": [{"size": "-1", "name": ""}, {"size": "2", "name": ""}],
            "unknown_rank": False,
        },
    }
    assert signatures["serving_default"]["method_name"] == "tensorflow/serving/predict"
    assert signatures["no_inputs"]["inputs"] == {}
    assert signatures["strings"]["inputs"]["word"]["tensor_shape"]["dim"] == []

    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "m"
    response = stub.GetModelMetadata(request, timeout=60)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    assert signature_map.signature_def["one_output"] == served.signatures["one_output"]
    del request.metadata_field[:]
    assert _grpc_error(stub.GetModelMetadata, request) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "GetModelMetadataRequest must specify at least one metadata_field",
    )
    with grpc.insecure_channel(served.grpc_target) as channel:
        model_service = model_service_pb2_grpc.ModelServiceStub(channel)
        status_request = get_model_status_pb2.GetModelStatusRequest()
        status_request.model_spec.name = "m"
        [version] = model_service.GetModelStatus(status_request, timeout=60).model_version_status
    assert version.version == 1
    assert version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE


def test_grpc_predict_with_an_output_filter(served, stub):
    x, ids = np.array([[1, 2]], np.float32), np.array([1], np.int64)
    request = _predict_request(x=x, ids=ids)
    request.output_filter.append("sum")
    response = stub.Predict(request, timeout=60)
    assert list(response.outputs) == ["sum"]
    assert list(response.outputs["sum"].float_val) == [9.0]  # typed fields, no tensor_content
    assert (
        response.model_spec.name,
        response.model_spec.signature_name,
        response.model_spec.version.value,
    ) == ("m", "serving_default", 1)
    request.output_filter.append("nope")
    assert _grpc_error(stub.Predict, request) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "output tensor alias not found in signature: nope "
        "Outputs expected to be in the set {big,sum}.",
    )
    request.output_filter[1] = "sum"
    assert _grpc_error(stub.Predict, request) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "duplicate output tensor alias: sum",
    )
    # The session checks dtypes, not shapes (Python's session.run would refuse [1, 3]).
    code, message = _grpc_error(stub.Predict, _predict_request(x=x.astype(np.int64), ids=ids))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "float but int64 is provided" in message
    response = stub.Predict(
        _predict_request(x=np.array([[1, 2, 3]], np.float32), ids=ids), timeout=60
    )
    assert tf.make_ndarray(response.outputs["sum"]).tolist() == [18.0]


def test_urls_and_bodies_are_refused_as_tf_serving_refuses_them(served):
    url = served.rest_url
    base = url[: -len("/v1/models/m")]
    assert _rest_error(url, {}) == (400, "Malformed request: POST /v1/models/m")
    assert _rest_error(url + ":PREDICT", {}) == (
        400,
        "Malformed request: POST /v1/models/m:PREDICT",
    )
    assert _rest_error(url + ":predict", method="PUT") == (
        400,
        "Malformed request: PUT /v1/models/m:predict",
    )
    assert _http(base + "/v2/models/m")[0] == 404  # no handler: libevent's HTML page
    assert _rest_error(base + "/v1/models/other:predict", {"inputs": [1]}) == (
        404,
        "Servable not found for request: Latest(other)",
    )
    assert _rest_error(url + "/versions/7:predict", {"inputs": [1]}) == (
        404,
        "Servable not found for request: Specific(m, 7)",
    )
    assert _rest_error(url + "/labels/canary:predict", {"inputs": [1]}) == (
        400,
        "Unrecognized servable version label: canary",
    )
    body = {"signature_name": "one_output", "inputs": [[1, 2]]}
    assert _rest(url + "/labels/stable:predict", body) == (200, {"outputs": [[3.0, 6.0]]})
    assert (
        _http(
            url + ":predict",
            gzip.compress(json.dumps(body).encode()),
            headers={"Content-Encoding": "gzip"},
        )[0]
        == 200
    )

    url += ":predict"
    assert _rest_error(url, b"") == (400, "JSON Parse error: The document is empty")
    status, message = _rest_error(url, {"inputs": [1], "instances": [1]})
    assert status == 400 and message.endswith(
        " Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist "
    )
    assert _rest_error(url, {"signature_name": "one_output"}) == (
        400,
        "Missing 'inputs' or 'instances' key",
    )
    assert _rest_error(url, {"signature_name": "one_output", "inputs": [["a", 1]]}) == (
        400,
        'JSON Value: "a" Type: String is not of expected type: float',
    )
    assert _rest_error(url, {"inputs": {"x": [[1, 2]], "ids": [1.5]}}) == (
        400,
        "JSON Value: 1.5 Type: Number is not of expected type: int64",
    )
    assert _rest_error(url, {"signature_name": "one_output", "inputs": [[1, 2], [3]]}) == (
        400,
        "Encountered list at unexpected size: 1 at level: 1 expected size: 2",
    )

    # :classify and :regress on Predict signatures: refused by the signature checks.
    assert _rest_error(served.rest_url + ":classify", {"examples": [{"a": 1}]}) == (
        400,
        "Expected one input Tensor.",
    )
    status, message = _rest_error(served.rest_url + ":regress", {"inputs": [1]})
    assert status == 400 and message.endswith(
        " When method is classify, key 'examples' is expected and was not found"
    )


def test_requests_run_concurrently(served, stub):
    answers, errors = {}, []

    def ask(i):
        try:
            if i % 2:
                body = {"signature_name": "one_output", "inputs": [[i, 1]]}
                answers[i] = _rest(served.rest_url + ":predict", body)[1]["outputs"][0][0]
            else:
                request = _predict_request("one_output", x=np.array([[i, 1]], np.float32))
                answers[i] = tf.make_ndarray(stub.Predict(request, timeout=60).outputs["y"])[0, 0]
        except Exception as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert answers == {i: 3.0 * i for i in range(16)}


def _warmup_export(export_dir, request):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        builder.add_meta_graph_and_variables(
            sess,
            ["serve"],
            signature_def_map={"serving_default": _signature({"x": x}, {"y": x + 1})},
        )
        builder.save()
    tf.io.gfile.makedirs(export_dir + "/assets.extra")
    with tf.io.TFRecordWriter(export_dir + "/assets.extra/tf_serving_warmup_requests") as out:
        log = prediction_log_pb2.PredictionLog()
        log.predict_log.request.CopyFrom(request)
        out.write(log.SerializeToString())


def test_warmup_requests_run_at_load_and_close_frees_the_ports(tmp_path):
    good = predict_pb2.PredictRequest()
    good.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([2], np.float32)))
    _warmup_export(str(tmp_path / "good"), good)
    with TFServingStandIn(str(tmp_path / "good")) as server:
        port = int(server.grpc_target.split(":")[1])
        rest_port = int(server.rest_url.split(":")[2].split("/")[0])
        assert _rest(server.rest_url + ":predict", {"instances": [1.5]}) == (
            200,
            {"predictions": [2.5]},
        )
    for closed in (port, rest_port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", closed), timeout=5).close()

    bad = predict_pb2.PredictRequest()
    bad.inputs["z"].CopyFrom(good.inputs["x"])
    _warmup_export(str(tmp_path / "bad"), bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Signature input alias: x"):
        TFServingStandIn(str(tmp_path / "bad"))
