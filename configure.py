"""Writes .bazelrc for building the op library against this Python's TensorFlow.

Run with the venv's interpreter (`make configure` does): the TensorFlow it imports is the one the
op library is compiled and linked against.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow's import: no banner


def main():
    import tensorflow as tf

    include_dir = tf.sysconfig.get_include()
    lib_dir = tf.sysconfig.get_lib()
    lib_name = None
    for flag in tf.sysconfig.get_link_flags():
        if flag.startswith("-l:"):
            lib_name = flag[3:]
    if lib_name is None:
        sys.exit("configure.py: cannot find the framework library in tf.sysconfig.get_link_flags()")
    compile_flags = [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("-I")]
    lines = [
        "# Written by configure.py for TensorFlow %s; do not edit (run `make configure`)."
        % tf.__version__,
        "build --repo_env=REC_SDK_TF_HEADER_DIR=%s" % include_dir,
        "build --repo_env=REC_SDK_TF_LIBRARY_DIR=%s" % lib_dir,
        "build --repo_env=REC_SDK_TF_LIBRARY_NAME=%s" % lib_name,
        "build --repo_env=REC_SDK_TF_VERSION=%s" % tf.__version__,
        # The sandbox symlinks every TF header into each action; local spawns halve build time.
        "build --spawn_strategy=local",
        "build --nosandbox_debug",
        "build --compilation_mode=opt",
        "build --cxxopt=-std=c++17",
        "build --host_cxxopt=-std=c++17",
    ]
    lines += ["build --copt=%s" % f for f in compile_flags if not f.startswith("--std")]
    lines += ["test --test_output=errors"]
    text = "\n".join(lines) + "\n"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".bazelrc")
    try:
        with open(path) as f:
            if f.read() == text:
                return  # unchanged: Bazel keeps its analysis cache
    except OSError:
        pass
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    print("configure.py: wrote %s for TensorFlow %s" % (path, tf.__version__))


if __name__ == "__main__":
    main()
