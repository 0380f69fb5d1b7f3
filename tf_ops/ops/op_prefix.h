// Every rec_sdk op name carries this prefix so it can never clash with a TensorFlow op.
// Python sees "RecSdk>TableGather" as rec_sdk_table_gather on the loaded library.
#ifndef REC_SDK_OPS_OP_PREFIX_H_
#define REC_SDK_OPS_OP_PREFIX_H_

#define REC_SDK_OP_NAME(name) "RecSdk>" #name

#endif  // REC_SDK_OPS_OP_PREFIX_H_
