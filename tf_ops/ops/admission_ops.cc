// Op definitions of admission and eviction (kernels/admission_kernels.cc): thresholds,
// access tracking, eviction by age and restriction to the most used keys.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP(REC_SDK_OP_NAME(TableConfigureAdmission))
    .Input("table: resource")
    .Output("configured: resource")
    .Attr("access_threshold: int >= -1 = -1")
    .Attr("eviction_threshold: int >= -1 = -1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Gives the table its admission and eviction thresholds (-1: off; eviction_threshold in clock
units) and forwards its handle: the ops that read the thresholds (training TableFindOrInsert,
TableEvict, TableSetAccessThreshold) take `configured` as their table, so they always run
after it. The first run sets the thresholds; later runs with the same values change nothing
(an access threshold changed by TableSetAccessThreshold stays); other values fail with
InvalidArgument naming the table and each differing threshold with both values.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableSetAccessThreshold))
    .Input("table: resource")
    .Input("threshold: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Sets the admission threshold of the table for later lookups (-1 turns admission off).
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableTrackAccess))
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Makes the table keep access counts and last-seen clocks current from now on, as a table
created with track_access does (a restrict policy given to a variable after it was created).
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableEvict))
    .Input("table: resource")
    .Output("rows_evicted: int64")
    .Output("pending_evicted: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Evicts the rows and pending admission counts whose last-seen clock is at least the table's
eviction threshold older than the newest clock it has seen.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableRestrict))
    .Input("table: resource")
    .Input("num_reserved: int64")
    .Output("removed: int64")
    .Attr("by: {'last_seen', 'count'}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Keeps the num_reserved rows seen most recently (by last_seen) or most often (by count; the
table needs track_access) and removes the others with their slots; returns how many went.
)doc");

}  // namespace rec_sdk
