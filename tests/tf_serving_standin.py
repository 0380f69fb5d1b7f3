"""A stand-in for TensorFlow Serving's model server (tensorflow_model_server), for tests that
drive a served SavedModel through TF Serving's REST and gRPC APIs. It keeps TF Serving's rules
as its source states them, refusals included: a lenient fake hides the bugs the real server
would show (a Predict request for a signature without inputs, refused over REST, once passed).

Source: tensorflow/serving at tag 2.15.1, the version of the protos used here. Each rule names
the file and function it follows. The model's rules are here; JSON as rapidjson reads and writes
it is in tf_serving_standin_json.py, json_tensor.cc's rules in tf_serving_standin_json_tensor.py,
the HTTP and gRPC servers in tf_serving_standin_servers.py.
Needs `pip install --no-deps tensorflow-serving-api==2.15.1` (protos and gRPC stubs; --no-deps
because it requires the `tensorflow` package, not tensorflow-cpu).

Not modelled: version polling (export_dir is the one version served), batching, request
logging, monitoring, CORS headers (off by default), and running Classify/Regress: those are
refused as TF Serving refuses them for a signature that does not fit, and answered
UNIMPLEMENTED by the stand-in when one would fit.
"""

import os
import re
import urllib.parse

import numpy as np
import tensorflow as tf
from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.client import pywrap_tf_session as tf_session
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    predict_pb2,
    prediction_log_pb2,
)

import tf_serving_standin_servers as servers
from tf_serving_standin_json import invalid_argument, status_json
from tf_serving_standin_json_tensor import (
    check_classify_regress_request,
    fill_predict_request,
    predict_response_json,
)

DEFAULT_SIGNATURE = "serving_default"  # kDefaultServingSignatureDefKey

# http_server.cc ToHTTPStatusCode: absl status code -> HTTP status.
_HTTP_STATUS = {
    0: 200,
    1: 499,
    2: 500,
    3: 400,
    4: 504,
    5: 404,
    6: 409,
    7: 403,
    8: 429,
    9: 400,
    10: 409,
    11: 400,
    12: 501,
    13: 500,
    14: 503,
    15: 500,
    16: 401,
}

# http_rest_api_util.cc kPredictionApiGegex and kModelStatusApiRegex (RE2, matched in full
# against the path and query); http_rest_api_util.h kHTTPRestApiHandlerPathRegex.
_PREDICT_PATH = re.compile(
    r"(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|"
    r"(?:/labels/([^/:]+)))?:(classify|regress|predict)",
    re.ASCII,
)
_STATUS_PATH = re.compile(
    r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|"
    r"(?:/labels/([^/:]+)))?(?:\/(metadata))?",
    re.ASCII,
)
_REST_PATH = re.compile(r"(?i)/v1/.*", re.ASCII)
# libevent's evhttp_send_error(req, HTTP_NOTFOUND, NULL), for paths no handler takes.
_NOT_FOUND_PAGE = (
    b"<HTML><HEAD>\n<TITLE>404 Not Found</TITLE>\n</HEAD><BODY>\n"
    b"<H1>Not Found</H1>\n</BODY></HTML>\n"
)

# tensor.cc ProtoHelper: the TensorProto field Tensor::AsProtoField fills for each dtype.
_PROTO_FIELD = {
    tf.float32: "float_val",
    tf.float64: "double_val",
    tf.int32: "int_val",
    tf.int16: "int_val",
    tf.int8: "int_val",
    tf.uint8: "int_val",
    tf.uint16: "int_val",
    tf.int64: "int64_val",
    tf.uint32: "uint32_val",
    tf.uint64: "uint64_val",
    tf.bool: "bool_val",
    tf.string: "string_val",
}


def _not_found(message):
    return tf.errors.NotFoundError(None, None, message)


def _as_proto_field(value, dtype):
    """Tensor::AsProtoField: PostProcessPredictionResult (predict_util.cc) writes outputs so by
    default, values in the typed fields rather than tensor_content."""
    # numpy's fixed-width bytes would drop trailing NULs of a scalar string: keep objects.
    array = np.asarray(value, dtype=object if dtype == tf.string else None)
    proto = tensor_pb2.TensorProto(dtype=dtype.as_datatype_enum)
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    flat = array.ravel()
    if dtype in (tf.float16, tf.bfloat16):
        proto.half_val.extend(flat.view(np.uint16).tolist())  # bit patterns
    elif dtype in (tf.complex64, tf.complex128):
        field = proto.scomplex_val if dtype == tf.complex64 else proto.dcomplex_val
        field.extend(np.stack([flat.real, flat.imag], -1).ravel().tolist())
    elif dtype in _PROTO_FIELD:
        getattr(proto, _PROTO_FIELD[dtype]).extend(flat.tolist())
    else:
        raise tf.errors.UnimplementedError(
            None, None, "TFServingStandIn cannot write a %s output" % dtype.name
        )
    return proto


def _proto_json(message, preserve_names=False):
    """protobuf's MessageToJsonString with add_whitespace and always_print_primitive_fields,
    as http_rest_api_util.cc ToJsonString prints it (the C++ printer indents by one space)."""
    options = dict(preserving_proto_field_name=preserve_names, indent=1, ensure_ascii=False)
    try:
        return json_format.MessageToJson(message, including_default_value_fields=True, **options)
    except TypeError:  # protobuf >= 5.26 renamed the option
        return json_format.MessageToJson(
            message, always_print_fields_with_no_presence=True, **options
        )


class _TensorParser:
    """Tensor::FromProto itself, through ParseTensor ops in a graph of their own: a request's
    TensorProto becomes the tensor TF Serving would feed (too few values are padded with the
    last one, too many cut), or None where FromProto refuses it."""

    _DTYPES = (
        tf.float32,
        tf.float64,
        tf.int32,
        tf.uint8,
        tf.int16,
        tf.int8,
        tf.string,
        tf.complex64,
        tf.int64,
        tf.bool,
        tf.bfloat16,
        tf.uint16,
        tf.complex128,
        tf.float16,
        tf.uint32,
        tf.uint64,
    )

    def __init__(self):
        graph = tf.Graph()
        with graph.as_default():
            self._serialized = tf.compat.v1.placeholder(tf.string, [])
            self._parsed = {
                dtype.as_datatype_enum: tf.io.parse_tensor(self._serialized, dtype)
                for dtype in self._DTYPES
            }
        graph.finalize()
        self.session = tf.compat.v1.Session(graph=graph)

    def tensor(self, proto):
        parse = self._parsed.get(proto.dtype)
        if parse is None:
            return None
        try:
            value = self.session.run(parse, {self._serialized: proto.SerializeToString()})
        except tf.errors.OpError:
            return None
        return np.asarray(value, dtype=object) if isinstance(value, bytes) else np.asarray(value)


class TFServingStandIn:
    """Loads export_dir like tensorflow_model_server (one session, tag "serve", its main op)
    and serves it as model `name`: REST on 127.0.0.1 (rest_url) and gRPC PredictionService on
    127.0.0.1 (grpc_target), free ports picked at start. Requests run concurrently (a thread pool).

    version: the version number TF Serving would read from the export's directory name.
    labels: version labels, as a model config file would set them ({"stable": 1}).
    session, graph, signatures: the loaded model, for tests that look inside.
    """

    def __init__(
        self, export_dir, name="model", version=1, labels=None, threads=None, rest_timeout_ms=30000
    ):
        self.name, self.version, self.labels = name, version, dict(labels or {})
        # server.h: grpc_max_threads and rest_api_num_threads are 4 per CPU.
        threads = threads or 4 * (os.cpu_count() or 1)
        # HttpRestApiHandler's constructor: REST runs get rest_api_timeout_in_ms (30 s default).
        self._rest_run_options = config_pb2.RunOptions(timeout_in_ms=rest_timeout_ms)
        self._rest_server = self._grpc_server = self._parser = None
        self.graph = tf.Graph()
        # server.cc: the session config TF Serving builds by default (parallelism 0: auto).
        self.session = tf.compat.v1.Session(graph=self.graph, config=config_pb2.ConfigProto())
        try:
            # saved_model_bundle_factory.cc: tags {"serve"} unless configured; TF's loader
            # restores the variables, then runs the main op (or legacy init op) once.
            with self.graph.as_default():
                meta_graph = tf.compat.v1.saved_model.loader.load(
                    self.session, ["serve"], export_dir
                )
            self.signatures = dict(meta_graph.signature_def)
            self._parser = _TensorParser()
            self._run_warmup(export_dir)
            self._rest_server = servers.start_rest_server(self, threads)
            self._grpc_server = servers.GrpcServer(self, threads)
        except BaseException:
            self.close()
            raise

    @property
    def rest_url(self):
        return "http://127.0.0.1:%d/v1/models/%s" % (
            self._rest_server.server_address[1],
            urllib.parse.quote(self.name, safe=""),
        )

    @property
    def grpc_target(self):
        return "127.0.0.1:%d" % self._grpc_server.port

    def close(self):
        """Stops both servers (requests in flight get a few seconds to finish), then closes
        the sessions."""
        for server in (self._grpc_server, self._rest_server):
            if server is not None:
                server.stop()
        self._grpc_server = self._rest_server = None
        if self._parser is not None:
            self._parser.session.close()
            self._parser = None
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # ---- The model: lookup, Predict, metadata, status ----------------------------------------

    def _find_version(self, model_spec):
        """ServerCore::ServableRequestFromModelSpec, then BasicManager's lookup
        (basic_manager.cc ServingMap::GetUntypedServableHandle, manager.h DebugString)."""
        name = model_spec.name
        if not name:
            raise invalid_argument("ModelSpec has no name specified.")
        choice = model_spec.WhichOneof("version_choice")
        if choice == "version_label":
            # ServerCore::GetModelVersionForLabel: labels come from the model config only.
            version = self.labels.get(model_spec.version_label) if name == self.name else None
            if version is None:
                raise invalid_argument(
                    "Unrecognized servable version label: ", model_spec.version_label
                )
            request = "Specific(%s, %d)" % (name, version)
        elif choice == "version":
            version = model_spec.version.value
            request = "Specific(%s, %d)" % (name, version)
        else:
            version, request = self.version, "Latest(%s)" % name
        if name != self.name or version != self.version:
            raise _not_found("Servable not found for request: " + request)
        return version

    def _predict(self, request, run_options):
        """TensorflowPredictor::Predict (predict_impl.cc): what REST and gRPC both run."""
        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        version = self._find_version(request.model_spec)
        return self._run_predict(request, version, run_options)

    def _run_predict(self, request, version, run_options):
        """predict_util.cc RunPredict, PreProcessPrediction and PostProcessPredictionResult.
        VerifySignature checks method_name only with --enable_signature_method_name_check,
        off by default (server.h), so any signature is run."""
        signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        signature = self.signatures.get(signature_name)
        if signature is None:
            raise tf.errors.FailedPreconditionError(
                None, None, 'Serving signature key "%s" not found.' % signature_name
            )
        response = predict_pb2.PredictResponse()
        # util.cc MakeModelSpec.
        response.model_spec.name = request.model_spec.name
        response.model_spec.signature_name = signature_name
        if version is not None:
            response.model_spec.version.value = version
        _verify_inputs_size(signature, request)
        feeds = self._input_values(signature, request)
        fetch_names, aliases = _outputs_to_fetch(signature, request)
        values = self._run_session(feeds, fetch_names, run_options)
        for alias, fetch_name, value in zip(aliases, fetch_names, values):
            dtype = self.graph.get_tensor_by_name(fetch_name).dtype.base_dtype
            response.outputs[alias].CopyFrom(_as_proto_field(value, dtype))
        return response

    def _input_values(self, signature, request):
        """tensorflow/cc/saved_model/util.cc GetInputValues: every signature input from the
        request or the signature's defaults, parsed by Tensor::FromProto; no name the
        signature lacks. TF iterates protobuf maps in no set order; here names are sorted."""
        feeds, used = [], set()
        for alias in sorted(signature.inputs):
            feed_name = signature.inputs[alias].name
            if alias in request.inputs:
                proto = request.inputs[alias]
                used.add(alias)
            elif alias in signature.defaults:
                proto = signature.defaults[alias]
            else:
                raise invalid_argument(
                    "Signature input alias: ",
                    alias,
                    "(feed name: ",
                    feed_name,
                    ") not found in request and no default value provided. Inputs expected to "
                    "be in the request {",
                    ",".join(sorted(request.inputs)),
                    "}, or default input alias set: ",
                    ",".join(sorted(signature.defaults)),
                )
            value = self._parser.tensor(proto)
            if value is None:
                raise invalid_argument("tensor parsing error: ", alias)
            feeds.append((feed_name, value))
        if request.inputs and len(used) != len(request.inputs):
            raise invalid_argument(
                "Inputs contains invalid name. Used request inputs: ",
                ",".join(sorted(used)),
                ", request input: ",
                ",".join(sorted(request.inputs)),
            )
        return feeds

    def _run_session(self, feeds, fetch_names, run_options):
        """Session::Run as TF Serving calls it, in C++: TF checks each feed's dtype ("Expects
        arg[0] to be float but int64 is provided") but not its shape. Python's session.run would
        cast feeds, check shapes and rewrite error messages, so it is bypassed."""
        try:
            feed_dict = {
                self.graph.get_tensor_by_name(name)._as_tf_output(): value for name, value in feeds
            }
        except (KeyError, ValueError):
            # TF's graph/subgraph.cc FeedInputs.
            missing = [n for n, _ in feeds if not self._has_tensor(n)][0]
            raise _not_found("FeedInputs: unable to find feed output " + missing) from None
        fetches = []
        for name in fetch_names:
            if not self._has_tensor(name):  # subgraph.cc FetchOutputs
                raise _not_found("FetchOutputs node %s: not found" % name)
            fetches.append(self.graph.get_tensor_by_name(name)._as_tf_output())
        options = (
            tf_session.TF_NewBufferFromString(run_options.SerializeToString())
            if run_options is not None
            else None
        )
        try:
            self.session._extend_graph()
            return self.session._call_tf_sessionrun(options, feed_dict, fetches, [], None)
        finally:
            if options is not None:
                tf_session.TF_DeleteBuffer(options)

    def _has_tensor(self, name):
        try:
            self.graph.get_tensor_by_name(name)
            return True
        except (KeyError, ValueError):
            return False

    def _model_metadata(self, request):
        """get_model_metadata_impl.cc GetModelMetadata: only the "signature_def" field, as a
        SignatureDefMap packed in an Any."""
        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        if not request.metadata_field:
            raise invalid_argument(
                "GetModelMetadataRequest must specify at least one metadata_field"
            )
        for field in request.metadata_field:
            if field != "signature_def":
                raise invalid_argument("Metadata field ", field, " is not supported")
        version = self._find_version(request.model_spec)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for key, signature in self.signatures.items():
            signature_map.signature_def[key].CopyFrom(signature)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = self.name
        response.model_spec.version.value = version
        response.metadata["signature_def"].Pack(signature_map)
        return response

    def _model_status(self, model_spec):
        """get_model_status_impl.cc GetModelStatusWithModelSpec: one version, or all of them
        (a version label is not resolved here: all versions are listed)."""
        if model_spec.HasField("version"):
            if (model_spec.name, model_spec.version.value) != (self.name, self.version):
                raise _not_found(
                    "Could not find version %d of model %s"
                    % (model_spec.version.value, model_spec.name)
                )
        elif model_spec.name != self.name:
            raise _not_found("Could not find any versions of model " + model_spec.name)
        response = get_model_status_pb2.GetModelStatusResponse()
        version_status = response.model_version_status.add(
            version=self.version, state=get_model_status_pb2.ModelVersionStatus.AVAILABLE
        )
        version_status.status.SetInParent()  # util/status_util.cc ToStatusProto: OK, no message
        return response

    def _refuse_classify_or_regress(self, verb, model_spec):
        """classifier.cc GetClassificationSignatureDef / PreProcessClassification and
        regressor.cc GetRegressionSignatureDef / PreProcessRegression (no method name check by
        default): the refusals a Predict-only signature meets. Always raises."""
        self._find_version(model_spec)
        name = model_spec.signature_name or DEFAULT_SIGNATURE
        signature = self.signatures.get(name)
        if signature is None:
            raise invalid_argument("No signature was found with the name: ", name)
        text = text_format.MessageToString(signature)  # SignatureDef::DebugString
        if len(signature.inputs) != 1:
            raise invalid_argument("Expected one input Tensor.")
        if verb == "classify":
            if len(signature.outputs) not in (1, 2):
                raise invalid_argument(
                    "Expected one or two output Tensors, found ", len(signature.outputs)
                )
            if "inputs" not in signature.inputs:
                raise invalid_argument("No classification inputs found in SignatureDef: ", text)
            if "classes" not in signature.outputs and "scores" not in signature.outputs:
                raise invalid_argument(
                    "Expected classification signature outputs to contain at least one of "
                    '"classes" or "scores". Signature was: ',
                    text,
                )
        else:
            if len(signature.outputs) != 1:
                raise invalid_argument("Expected one output Tensor.")
            if "inputs" not in signature.inputs:
                raise invalid_argument("No regression inputs found in SignatureDef: ", text)
            if "outputs" not in signature.outputs:
                raise invalid_argument("No regression outputs found in SignatureDef: ", text)
        raise tf.errors.UnimplementedError(
            None,
            None,
            "TFServingStandIn does not run %s (signature %s would take it)" % (verb, name),
        )

    def _run_warmup(self, export_dir):
        """saved_model_warmup_util.cc RunSavedModelWarmup (model warmup is on by default): each
        PredictionLog in assets.extra/tf_serving_warmup_requests runs once at load, and one
        failure fails the load (here: the constructor raises)."""
        path = os.path.join(export_dir, "assets.extra", "tf_serving_warmup_requests")
        if not tf.io.gfile.exists(path):
            return
        for count, record in enumerate(tf.compat.v1.io.tf_record_iterator(path), 1):
            log = prediction_log_pb2.PredictionLog()
            try:
                log.ParseFromString(record)
            except DecodeError:
                raise invalid_argument(
                    "Failed to parse warmup record: ", record, " from ", path
                ) from None
            kind = log.WhichOneof("log_type")
            if kind == "predict_log":  # saved_model_warmup.cc RunWarmupRequest
                self._run_predict(log.predict_log.request, None, None)
            elif kind in ("predict_streamed_log", "session_run_log"):
                raise tf.errors.UnimplementedError(
                    None,
                    None,
                    "Unsupported log_type for warmup: %d"
                    % log.DESCRIPTOR.fields_by_name[kind].number,
                )
            elif kind is not None:
                raise NotImplementedError("TFServingStandIn runs no %s warmup records" % kind)
            if count > 1000:  # WarmupConsts::kMaxNumRecords
                raise invalid_argument(
                    "Number of warmup records exceeds the maximum (1000) at ", path
                )

    # ---- REST: http_rest_api_handler.cc --------------------------------------------------------

    def _answer_rest(self, method, path, body, origin):
        """http_server.cc RestApiRequestDispatcher: (HTTP status, content type, body)."""
        if not _REST_PATH.fullmatch(path):
            return 404, "text/html", _NOT_FOUND_PAGE
        if method == "OPTIONS":
            # A CORS preflight never reaches the handler; the reply has no body.
            return (200 if re.search("https?://", origin) else 400), None, b""
        try:
            return 200, "application/json", self._process_rest(method, path, body)
        except tf.errors.OpError as e:
            # HttpRestApiHandler::ProcessRequest + MakeJsonFromStatus, ToHTTPStatusCode.
            return (_HTTP_STATUS.get(e.error_code, 500), "application/json", status_json(e.message))
        except Exception as e:  # a gap in the stand-in, not TF Serving's answer: say so
            return 500, "application/json", status_json("TFServingStandIn failed: %r" % e)

    def _process_rest(self, method, path, body):
        """HttpRestApiHandler::ProcessRequest: POST runs a verb, GET reads status or metadata;
        anything else is a malformed request. The verb is compared in lower case although the
        URL pattern ignores case, so ":PREDICT" is malformed too."""
        name, version, label, last_part, matched = _parse_model_info(method, path)
        spec = model_pb2.ModelSpec(name=name)  # FillModelSpecWithNameVersionAndLabel
        if version is not None:
            spec.version.value = version
        if label is not None:
            spec.version_label = label
        if method == "POST" and matched:
            if last_part == "predict":
                return self._rest_predict(spec, body)
            if last_part in ("classify", "regress"):
                check_classify_regress_request(body, spec)
                self._refuse_classify_or_regress(last_part, spec)
        elif method == "GET" and matched:
            if not name:
                raise invalid_argument("Missing model name in request.")
            if last_part == "metadata":
                return self._rest_metadata(spec)
            return _proto_json(self._model_status(spec)).encode("utf-8")
        raise invalid_argument("Malformed request: ", method, " ", path)

    def _rest_predict(self, spec, body):
        """ProcessPredictRequest: JSON to a PredictRequest, Predict, the response to JSON."""
        request = predict_pb2.PredictRequest(model_spec=spec)

        def input_infos(signature_name):  # HttpRestApiHandler::GetInfoMap
            self._find_version(request.model_spec)
            name = signature_name or DEFAULT_SIGNATURE
            if name not in self.signatures:
                raise invalid_argument(
                    'Serving signature name: "', name, '" not found in signature def'
                )
            return self.signatures[name].inputs

        request_format = fill_predict_request(body, input_infos, request)
        response = self._predict(request, self._rest_run_options)
        return predict_response_json(response.outputs, request_format)

    def _rest_metadata(self, spec):
        """ProcessModelMetadataRequest, and http_rest_api_util.cc ToJsonString: the model spec
        and the SignatureDefMap printed apart (field names kept) and joined by hand."""
        request = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=spec, metadata_field=["signature_def"]
        )
        response = self._model_metadata(request)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)
        return (
            '{\n"model_spec":'
            + _proto_json(response.model_spec, True)
            + ",\n"
            + '"metadata": {"signature_def": '
            + _proto_json(signature_map, True)
            + "}\n}\n"
        ).encode("utf-8")


def _parse_model_info(method, path):
    """http_rest_api_util.cc ParseModelInfo: (name, version, label, verb or subresource,
    matched); the name and label are URL-decoded (DecodeArg), the version must fit int64."""
    pattern = {"POST": _PREDICT_PATH, "GET": _STATUS_PATH}.get(method)
    match = pattern.fullmatch(path) if pattern else None
    name, version_text, label, last_part = match.groups("") if match else ("", "", "", "")

    def decode(text):
        return urllib.parse.unquote_to_bytes(text).decode("utf-8", "replace")

    version = None
    if version_text:
        version = int(version_text)
        if version >= 2**63:
            raise invalid_argument("Failed to convert version: ", version_text, " to numeric.")
    return decode(name), version, decode(label) if label else None, last_part, bool(match)


def _verify_inputs_size(signature, request):
    """predict_util.cc VerifyRequestInputsSize: no more inputs than the signature's, and no
    fewer unless it has defaults. A signature without inputs passes with none sent."""
    sent, expected = set(request.inputs), set(signature.inputs)
    if len(sent) > len(expected) or (len(sent) < len(expected) and not signature.defaults):
        raise invalid_argument(
            "input size does not match signature: ",
            len(sent),
            "!=",
            len(expected),
            " len({",
            ",".join(sorted(sent)),
            "}) != len({",
            ",".join(sorted(expected)),
            "}). Sent extra: {",
            ",".join(sorted(sent - expected)),
            "}. Missing but required: {",
            ",".join(sorted(expected - sent)),
            "}.",
        )


def _outputs_to_fetch(signature, request):
    """PreProcessPrediction: the output_filter's aliases in its order (each known, none twice),
    or every output of the signature."""
    names, aliases = [], []
    for alias in request.output_filter:
        if alias not in signature.outputs:
            raise invalid_argument(
                "output tensor alias not found in signature: ",
                alias,
                " Outputs expected to be in the set {",
                ",".join(sorted(signature.outputs)),
                "}.",
            )
        if alias in aliases:
            raise invalid_argument("duplicate output tensor alias: ", alias)
        names.append(signature.outputs[alias].name)
        aliases.append(alias)
    if not names:
        aliases = sorted(signature.outputs)
        names = [signature.outputs[alias].name for alias in aliases]
    return names, aliases
