"""Repository rule exposing the pip-installed TensorFlow's headers and framework library.

configure.py writes the four REC_SDK_TF_* variables into .bazelrc as --repo_env lines, so the
repository is re-created whenever the venv's TensorFlow changes.
"""

_ENV = [
    "REC_SDK_TF_HEADER_DIR",
    "REC_SDK_TF_LIBRARY_DIR",
    "REC_SDK_TF_LIBRARY_NAME",
    "REC_SDK_TF_VERSION",
]

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "tf_header_lib",
    hdrs = glob(["include/**"], exclude = ["include/**/*.so"]),
    includes = ["include"],
)

cc_library(
    name = "libtensorflow_framework",
    srcs = ["{library}"],
)

exports_files(["tf_version.txt"])
"""

def _tf_configure_impl(ctx):
    values = {}
    for name in _ENV:
        value = ctx.os.environ.get(name, "")
        if not value:
            fail("%s is not set: run `make configure` (or `.venv/bin/python configure.py`) " % name +
                 "to write .bazelrc from the venv's TensorFlow.")
        values[name] = value
    ctx.symlink(values["REC_SDK_TF_HEADER_DIR"], "include")
    library = values["REC_SDK_TF_LIBRARY_NAME"]
    ctx.symlink(values["REC_SDK_TF_LIBRARY_DIR"] + "/" + library, library)
    ctx.file("tf_version.txt", values["REC_SDK_TF_VERSION"] + "\n")
    ctx.file("BUILD", _BUILD.format(library = library))

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = _ENV,
    local = True,
)
