"""The foundation every other folder builds on: the logger, argument checks, the per-graph
state, TensorFlow's version differences and the one table of patches to TensorFlow, the
release's versions. Nothing here imports another rec_sdk folder but `constants`."""
