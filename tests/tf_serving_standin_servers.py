"""The two network servers of the stand-in in tf_serving_standin.py: REST over HTTP and gRPC
on 127.0.0.1, ports picked by the system, each answering from a thread pool as
tensorflow_model_server does (tensorflow/serving 2.15.1; files named below).
"""

import concurrent.futures
import gzip
import http.server
import socketserver
import threading
import zlib

import grpc
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from tf_serving_standin_json import invalid_argument

# grpc_status_util.cc ToGRPCStatus: the same code number.
_GRPC_CODE = {code.value[0]: code for code in grpc.StatusCode}


class GrpcServer:
    """The gRPC server of server.cc BuildAndStart: PredictionService and ModelService, no
    message size limit below 2 GB, grpc_max_threads workers."""

    def __init__(self, standin, threads):
        self._pool = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="tf-serving-grpc"
        )
        limit = 2**31 - 1
        self._server = grpc.server(
            self._pool,
            options=[
                ("grpc.max_send_message_length", limit),
                ("grpc.max_receive_message_length", limit),
            ],
        )
        try:
            prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
                _PredictionService(standin), self._server
            )
            model_service_pb2_grpc.add_ModelServiceServicer_to_server(
                _ModelService(standin), self._server
            )
            self.port = self._server.add_insecure_port("127.0.0.1:0")
            self._server.start()
        except BaseException:
            self.stop()
            raise

    def stop(self):
        """Refuses new calls, gives those in flight 5 s, and waits for the workers."""
        self._server.stop(5).wait()
        self._pool.shutdown(wait=True)


def _grpc_answer(context, method, *args):
    """grpc_status_util.cc ToGRPCStatus: the same code, the message cut at 1024 bytes."""
    try:
        return method(*args)
    except tf.errors.OpError as e:
        message = e.message.encode("utf-8", "surrogateescape")
        if len(message) > 1024:
            message = message[:1024] + b"...TRUNCATED"
        context.abort(_GRPC_CODE[e.error_code], message.decode("utf-8", "replace"))


class _PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """prediction_service_impl.cc PredictionServiceImpl (MultiInference is not served)."""

    def __init__(self, standin):
        self._standin = standin

    def Predict(self, request, context):
        # enforce_session_run_timeout (on by default): the call's deadline bounds Session::Run.
        remaining = context.time_remaining()
        options = (
            config_pb2.RunOptions(timeout_in_ms=max(1, int(remaining * 1000)))
            if remaining is not None and remaining < 2**31 / 1000
            else None
        )
        return _grpc_answer(context, self._standin._predict, request, options)

    def GetModelMetadata(self, request, context):
        return _grpc_answer(context, self._standin._model_metadata, request)

    def Classify(self, request, context):
        return _grpc_answer(context, self._classify_or_regress, "classify", request)

    def Regress(self, request, context):
        return _grpc_answer(context, self._classify_or_regress, "regress", request)

    def _classify_or_regress(self, verb, request):
        # classification_service.cc / regression_service.cc.
        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        self._standin._refuse_classify_or_regress(verb, request.model_spec)


class _ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """model_service_impl.cc GetModelStatus (configuration reloads are not served)."""

    def __init__(self, standin):
        self._standin = standin

    def GetModelStatus(self, request, context):
        return _grpc_answer(context, self._model_status, request)

    def _model_status(self, request):
        if not request.HasField("model_spec"):  # GetModelStatusImpl::GetModelStatus
            raise invalid_argument("Missing ModelSpec")
        return self._standin._model_status(request.model_spec)


def start_rest_server(standin, threads):
    """The HTTP server of http_server.cc CreateAndStartHttpServer, accepting connections."""
    server = _RestServer(standin, threads)
    try:
        threading.Thread(
            target=server.serve_forever, name="tf-serving-rest-accept", daemon=True
        ).start()
    except BaseException:
        server.server_close()
        raise
    return server  # stop() may call shutdown() only once serve_forever runs


class _RestServer(http.server.HTTPServer):
    """The HTTP server of http_server.cc CreateAndStartHttpServer: requests are handled by a
    pool of rest_api_num_threads threads."""

    def __init__(self, standin, threads):
        super().__init__(("127.0.0.1", 0), _RestHandler)
        self.standin = standin
        self.pool = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="tf-serving-rest"
        )

    def server_bind(self):
        # HTTPServer.server_bind would look the address up in DNS (socket.getfqdn).
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def stop(self):
        """Stops accepting, then waits for the requests in flight."""
        self.shutdown()
        self.server_close()
        self.pool.shutdown(wait=True)

    def process_request(self, request, client_address):
        self.pool.submit(self._handle, request, client_address)

    def _handle(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:  # reported as socketserver reports it
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)


class _RestHandler(http.server.BaseHTTPRequestHandler):
    """One HTTP request: the body read whole (gzip-encoded bodies uncompressed, as net_http's
    auto_uncompress_input does by default), then answered by the stand-in."""

    protocol_version = "HTTP/1.1"  # answers "Expect: 100-continue" as libevent does
    timeout = 60  # a client that stops sending must not hold a worker

    def _serve(self):
        status, content_type, body = self.server.standin._answer_rest(
            self.command, self.path, self._read_body(), self.headers.get("Origin", "")
        )
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")  # one request per connection keeps close() quick
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = _serve

    def _read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if not size:
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            body = b"".join(chunks)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "gzip" in self.headers.get("Content-Encoding", ""):
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError, zlib.error):
                body = b""  # evhttp_request.cc: a body that does not uncompress reads as empty
        return body

    def log_message(self, *args):
        del args
