"""The serving side of updates: a served model follows the chain of its push directory.

follow(push_dir, model) brings the model to the newest published update, applying at most
two (update_files.py: updates are cumulative since a whole update); a missing update or one
the model refuses (corrupt, truncated, of another chain) stops it with UpdateError naming
the update, and the model keeps serving the last good version. `model` is anything with
version() -> (version, chain) and apply(update_dir) -> version: a ServedModel (the
SavedModel loaded in this process), a RestModel or a GrpcModel (TensorFlow Serving's REST or
gRPC API: the model's "version" and "apply_update" signatures through Predict).

    python -m rec_sdk.serving.follow --push_dir DIR --server http://HOST:8501/v1/models/NAME

(follow.py) is the small watcher to run beside a TensorFlow Serving process: it polls the
push directory and applies each new update through the server's Predict API.
"""

import json
import os
import time
import urllib.request

import grpc  # TensorFlow's own dependency
import numpy as np
import tensorflow as tf

try:  # GrpcModel's protos: the optional tensorflow-serving-api package
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_service_pb2_grpc

    _SERVING_API_MISSING = None
except ImportError as e:
    model_pb2 = predict_pb2 = prediction_service_pb2_grpc = None
    _SERVING_API_MISSING = str(e)

from rec_sdk.base.log import logger
from rec_sdk.ops.loader import load_ops_if_built
from rec_sdk.serving import update_files
from rec_sdk.serving.export import APPLY_SIGNATURE, VERSION_INPUT, VERSION_SIGNATURE
from rec_sdk.serving.update_files import UpdateError


class ServedModel:
    """A SavedModel of export_serving_model loaded in this process, in its own graph and
    session (stock TensorFlow's loader; the op library is loaded for plugin-mode models)."""

    def __init__(self, export_dir):
        load_ops_if_built()  # a plugin-mode model needs the op library
        self.graph = tf.Graph()
        self.sess = tf.compat.v1.Session(graph=self.graph)
        with self.graph.as_default():
            meta = tf.compat.v1.saved_model.loader.load(
                self.sess, [tf.saved_model.SERVING], export_dir
            )
        self.signatures = meta.signature_def

    def run(self, signature, feeds=None):
        if signature not in self.signatures:
            raise ValueError(
                "the model has no signature %r (it has %s)" % (signature, sorted(self.signatures))
            )
        sig = self.signatures[signature]
        unknown = sorted(set(feeds or {}) - set(sig.inputs))
        if unknown:
            raise ValueError(
                "signature %r has no inputs %s (its inputs: %s)"
                % (signature, unknown, sorted(sig.inputs))
            )
        feed = {sig.inputs[k].name: v for k, v in (feeds or {}).items()}
        return self.sess.run({k: v.name for k, v in sig.outputs.items()}, feed)

    def predict(self, feeds):
        return self.run("serving_default", feeds)

    def version(self):
        out = self.run(VERSION_SIGNATURE, {VERSION_INPUT: 0})
        return int(out["version"]), out["chain"].decode()

    def apply(self, update_dir):
        try:
            return int(self.run(APPLY_SIGNATURE, {"update_dir": update_dir})["version"])
        except tf.errors.OpError as e:
            raise UpdateError("update %s refused: %s" % (update_dir, e.message)) from None

    def close(self):
        self.sess.close()


class RestModel:
    """A model served by TensorFlow Serving, reached through its REST Predict API at `url`
    (http://HOST:PORT/v1/models/NAME)."""

    def __init__(self, url, timeout=600):
        self.url, self.timeout = url.rstrip("/"), timeout

    def run(self, signature, inputs):
        """Predict of `signature` with `inputs` ({name: value}, in TF Serving's columnar
        "inputs" format); returns its "outputs" as TF Serving writes them: a dict by output
        name, or the value itself when the signature has one output."""
        body = json.dumps(
            {
                "signature_name": signature,
                "inputs": {
                    k: np.asarray(v).tolist() if isinstance(v, np.ndarray) else v
                    for k, v in inputs.items()
                },
            }
        ).encode()
        request = urllib.request.Request(
            self.url + ":predict", body, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())["outputs"]
        except urllib.error.HTTPError as e:
            raise UpdateError(
                "%s (%s): %s" % (signature, self.url, e.read().decode(errors="replace"))
            ) from None

    def predict(self, feeds):
        return self.run("serving_default", feeds)

    def version(self):
        out = self.run(VERSION_SIGNATURE, {VERSION_INPUT: 0})
        return int(out["version"]), str(out["chain"])

    def apply(self, update_dir):
        out = self.run(APPLY_SIGNATURE, {"update_dir": update_dir})
        return int(out["version"] if isinstance(out, dict) else out)


class GrpcModel:
    """A model served by TensorFlow Serving, reached through its gRPC PredictionService at
    `target` (HOST:PORT) under model name `name`. Needs the tensorflow-serving-api package
    (its protos; `pip install --no-deps tensorflow-serving-api`)."""

    def __init__(self, target, name, timeout=600):
        if _SERVING_API_MISSING:
            raise ImportError(
                "GrpcModel needs the tensorflow-serving-api package: pip install "
                "--no-deps tensorflow-serving-api (%s)" % _SERVING_API_MISSING
            )
        self.target, self.name, self.timeout = target, name, timeout
        self._channel = grpc.insecure_channel(
            target,
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
        )
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)

    def run(self, signature, inputs):
        """Predict of `signature` with `inputs` ({name: array}); returns {output: array}."""
        request = predict_pb2.PredictRequest(
            model_spec=model_pb2.ModelSpec(name=self.name, signature_name=signature)
        )
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        try:
            response = self._stub.Predict(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise UpdateError(
                "%s (%s, model %s): %s" % (signature, self.target, self.name, e.details())
            ) from None
        return {key: tf.make_ndarray(value) for key, value in response.outputs.items()}

    def predict(self, feeds):
        return self.run("serving_default", feeds)

    def version(self):
        out = self.run(VERSION_SIGNATURE, {VERSION_INPUT: np.int64(0)})
        return int(out["version"]), out["chain"].item().decode()

    def apply(self, update_dir):
        return int(self.run(APPLY_SIGNATURE, {"update_dir": update_dir})["version"])

    def close(self):
        self._channel.close()


def model_at(url):
    """The model a watcher drives: http://HOST:PORT/v1/models/NAME (TensorFlow Serving's
    REST API) or grpc://HOST:PORT/NAME (its gRPC API)."""
    if url.startswith("grpc://"):
        target, _, name = url[len("grpc://") :].partition("/")
        if not target or not name or "/" in name:
            raise ValueError("a gRPC server is grpc://HOST:PORT/MODEL_NAME, got %r" % url)
        return GrpcModel(target, name)
    if url.startswith(("http://", "https://")):
        return RestModel(url)
    raise ValueError(
        "--server must be http://HOST:PORT/v1/models/NAME (REST) or "
        "grpc://HOST:PORT/NAME (gRPC), got %r" % url
    )


def _manifest(push_dir, version, what):
    path = os.path.join(update_files.update_dir(push_dir, version), update_files.MANIFEST)
    if not os.path.exists(path):
        raise UpdateError("update %d (%s) is missing from %s" % (version, what, push_dir))
    return update_files.read_manifest(path)


def follow(push_dir, model):
    """Brings the model to the newest published update: applies it, after the whole update
    it builds on when the model is behind that one (so at most two updates, however far
    behind). Returns the versions applied. UpdateError for a missing or refused update (the
    model keeps its version)."""
    version, chain = model.version()
    base = os.path.join(push_dir, update_files.BASE)
    if not os.path.exists(base):
        raise UpdateError(
            "%s holds no update chain (no %s): the export's push_dir is where "
            "its updates are published" % (push_dir, update_files.BASE)
        )
    base_chain = update_files.read_manifest(base)["chain"]
    if base_chain != chain:
        raise UpdateError(
            "%s is the push directory of another export (chain %s); the model "
            "serves chain %s" % (push_dir, base_chain, chain)
        )
    published = update_files.published_versions(push_dir)
    if not published or published[-1] <= version:
        return []
    newest = _manifest(push_dir, published[-1], "the newest")
    plan = [newest["version"]]
    if newest["base"] > version:
        whole = _manifest(
            push_dir,
            newest["base"],
            "the whole update that update %d builds on" % newest["version"],
        )
        if not whole["whole"]:
            raise UpdateError(
                "update %d in %s is not a whole update, yet update %d builds on "
                "it" % (whole["version"], push_dir, newest["version"])
            )
        plan.insert(0, whole["version"])
    applied = []
    for published_version in plan:
        version = model.apply(update_files.update_dir(push_dir, published_version))
        applied.append(version)
    return applied


def watch(push_dir, model, interval=5.0, stop=None):
    """Follows the push directory every `interval` seconds until stop (a threading.Event) is
    set; errors are logged and retried (the model keeps serving its version)."""
    while stop is None or not stop.is_set():
        try:
            for version in follow(push_dir, model):
                logger.info("applied serving update %d", version)
        except (UpdateError, OSError) as e:
            logger.error("%s", e)
        if stop is None:
            time.sleep(interval)
        else:
            stop.wait(interval)
