"""de.keras.callbacks: TFRA's Keras callbacks. ModelCheckpoint is Keras' own: a model with
de layers saves its tables with its weights (see de.keras.models). The Horovod callbacks
exist and say that Horovod is out of scope."""

from rec_sdk.base.tf_compat import keras

ModelCheckpoint = keras.callbacks.ModelCheckpoint


class _Horovod:  # pylint: disable=too-few-public-methods
    def __init__(self, *args, **kwargs):
        del args, kwargs
        raise NotImplementedError(
            "de.keras.callbacks.%s needs Horovod, which rec_sdk does not "
            "support; use tf.keras.callbacks (ModelCheckpoint saves de "
            "tables with the weights)" % type(self).__name__
        )


class DEHvdBroadcastGlobalVariablesCallback(_Horovod):
    """TFRA's Horovod broadcast callback: out of scope in rec_sdk."""


class DEHvdModelCheckpoint(_Horovod):
    """TFRA's Horovod model checkpoint: out of scope in rec_sdk."""
