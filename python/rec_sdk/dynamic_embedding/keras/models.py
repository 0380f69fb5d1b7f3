"""de.keras.models: saving Keras models with de.keras.layers (TFRA's names).

de_save_model (= save_model) writes the model as a TensorFlow SavedModel, tables included
(their keys, rows and slots are saved as tensors, see rec_sdk.tables.table); load it back with
model.load_weights(path) into a model built by the same code, or tf.saved_model.load(path) in
a process that imports rec_sdk. For serving without the rec_sdk plugin, use
rec_sdk.serving.export_keras_model.
"""

from rec_sdk.base.tf_compat import keras
from rec_sdk.dynamic_embedding.keras import file_system


def de_save_model(
    model,
    filepath,
    overwrite=True,
    include_optimizer=True,
    signatures=None,
    options=None,
    save_traces=True,
):
    """tf.keras.models.save_model in the SavedModel format, TFRA's arguments (with the
    FileSystemSaver variables' files, see de.keras.file_system)."""
    result = keras.models.save_model(
        model,
        filepath,
        overwrite=overwrite,
        include_optimizer=include_optimizer,
        save_format="tf",
        signatures=signatures,
        options=options,
        save_traces=save_traces,
    )
    file_system.save_tables(model, filepath)
    return result


save_model = de_save_model
