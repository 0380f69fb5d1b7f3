"""The watcher to run beside a TensorFlow Serving process that serves an export_serving_model:

    python -m rec_sdk.serving.follow --push_dir DIR --server http://HOST:8501/v1/models/NAME
    python -m rec_sdk.serving.follow --push_dir DIR --server grpc://HOST:8500/NAME

polls the push directory and applies each new update through the server's REST or gRPC
Predict API (replica.follow, RestModel, GrpcModel). The package does not import this module, so that
`python -m` runs it without a warning.
"""

import argparse
import json
import sys

from rec_sdk.serving.replica import follow, model_at, watch
from rec_sdk.serving.update_files import UpdateError


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Applies a push directory's updates to a model TensorFlow Serving serves."
    )
    parser.add_argument("--push_dir", required=True)
    parser.add_argument(
        "--server",
        required=True,
        help="the model in TensorFlow Serving: its REST URL, "
        "http://HOST:8501/v1/models/NAME, or grpc://HOST:8500/NAME",
    )
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--once", action="store_true", help="apply what is there and exit")
    args = parser.parse_args(argv)
    try:
        model = model_at(args.server)
    except (ValueError, ImportError) as e:
        parser.error(str(e))
    if args.once:
        try:
            print(json.dumps({"applied": follow(args.push_dir, model)}))
        except UpdateError as e:
            print(e, file=sys.stderr)
            return 1
        return 0
    watch(args.push_dir, model, args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
