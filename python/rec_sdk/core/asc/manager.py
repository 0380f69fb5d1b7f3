"""start_asc_pipeline (mirrors mx_rec.core.asc.manager).

rec_sdk's key preprocessing runs inside tf.data (see rec_sdk.core.asc.helper), so there is no
separate process or thread to start. start_asc_pipeline checks that the pipeline and the
tables fit together: every FeatureSpec of an insert function built in this graph names a table
that exists, and a table's specs agree on its admission and eviction thresholds.
"""

import tensorflow as tf

from rec_sdk.base.log import logger
from rec_sdk.core.asc import helper
from rec_sdk.tables.table import tables_of_graph
from rec_sdk.util import initialize


def start_asc_pipeline(graph=None):
    """Checks the FeatureSpec pipelines of `graph` (default: the default graph) against its
    tables; raises ValueError naming the spec and the tables that exist."""
    initialize.get_config()
    graph = graph or tf.compat.v1.get_default_graph()
    tables = {t.table_name: t for t in tables_of_graph(graph)}
    pipelines = helper.registered_specs(graph)
    for specs, training in pipelines:
        for spec in specs:
            if spec.is_timestamp:
                continue
            if spec.table_name not in tables:
                raise ValueError(
                    "FeatureSpec %r names table %r, which does not exist; the "
                    "tables are %s" % (spec.name, spec.table_name, sorted(tables))
                )
            table = tables[spec.table_name]
            if training and table.lookups.specs and (spec.name, True) not in table.lookups.specs:
                logger.warning(
                    "FeatureSpec %r of a training pipeline has no training sparse_lookup; its "
                    "keys are still counted and inserted into table %r with the table's other "
                    "features (they are deduplicated together), and count against the send "
                    "counts of its lookups",
                    spec.name,
                    spec.table_name,
                )
    logger.info(
        "rec_sdk: FeatureSpec pipeline ready: %d insert function(s), tables %s",
        len(pipelines),
        sorted(tables),
    )
