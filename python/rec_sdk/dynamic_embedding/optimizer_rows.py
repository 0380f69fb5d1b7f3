"""How DynamicEmbeddingOptimizer updates a de.Variable's rows (RowUpdate): the wrapped stock
optimizer's parameters read (v1 and Keras, through optimizer_kinds' reader) and applied by
the row kernels of its family, or, for any other optimizer, the optimizer's own update on the
step's rows and slots (read from the table and written back; Keras optimizers through
keras_rows.KerasRows). rec_sdk.dynamic_embedding.optimizer wires it into apply_gradients."""

import tensorflow as tf

from rec_sdk.base import tf_patches
from rec_sdk.dynamic_embedding.keras_rows import KerasRows
from rec_sdk.dynamic_embedding.optimizer_kinds import (
    family,
    hyper,
    initial_accumulator,
    kind,
    name_of,
    private_call,
    private_state,
    slot_info,
)
from rec_sdk.ops import optimizer_ops, table_ops
from rec_sdk.optimizers.row_update import row_variable, through_variables


def _outer_graph():
    """What optimizer state lives as long as: the default graph in graph mode; in TF2 the
    eager program (None), one for all tf.functions and their retracing."""
    if tf.compat.v1.executing_eagerly_outside_functions():
        return None
    return tf.compat.v1.get_default_graph()


class RowUpdate:
    """Applies one stock optimizer's update to de rows: rec_sdk's fused kernels where the
    optimizer's update is one of them, else the optimizer's own update on gathered rows."""

    def __init__(self, optimizer):
        self.family = family(optimizer)
        self.kind, self.slot_names = kind(optimizer)
        self.optimizer = optimizer
        self._name = name_of(optimizer)
        # outer graph -> Adam's float32 beta powers (v1: one optimizer, many graphs)
        self._beta_powers = {}
        self._generic_locals = {}  # (outer graph, table name) -> the generic path's state
        self._shared_state = {}  # outer graph -> the Keras copy holding optimizer-wide state
        self._keras_slots = None

    # --- the step's hyperparameters ---
    def _v1_params(self):
        """Hyperparameters of a tf.compat.v1.train optimizer, as the kernels take them."""
        o = self.optimizer
        if self.kind != "adam":
            params = {
                key: _ATTR_TYPES.get(key, _f)(private_state(o, attribute))
                for key, attribute in _V1_PARAMS.get(self.kind, _V1_PARAMS["sgd"])
            }
            if self.kind == "adagrad":
                params["epsilon"] = 0.0
            if self.kind == "ftrl":
                params["beta"] = _f(hyper(private_state(o, "_beta", None)) or 0.0)
            return params
        # As TensorFlow's AdamOptimizer: float32 beta1_power and beta2_power, multiplied by
        # beta1 and beta2 after each step, give the bias-corrected rate, so that a de.Variable
        # trains exactly as a dense variable with the same optimizer (a step count and double
        # precision would differ from it by ~1e-6 after a few steps).
        adam = {key: private_state(o, attribute) for key, attribute in _V1_PARAMS["adam"]}
        graph = _outer_graph()
        if graph not in self._beta_powers:
            with tf.init_scope():
                self._beta_powers[graph] = tuple(
                    tf.compat.v1.Variable(
                        tf.cast(hyper(adam[which]), tf.float32),
                        trainable=False,
                        name="%s_de_%s_power" % (self._name, which),
                    )
                    for which in ("beta1", "beta2")
                )
                # The optimizer's own variables (its variables() and TF2 checkpoints list
                # them), keyed as tf.compat.v1 optimizers key theirs: (name, graph).
                eager = tf.compat.v1.executing_eagerly_outside_functions()
                for which, power in zip(("beta1", "beta2"), self._beta_powers[graph]):
                    private_state(o, "_non_slot_dict")[
                        ("de_%s_power" % which, None if eager else power.graph)
                    ] = power
        powers = self._beta_powers[graph]
        beta1_power, beta2_power = (p.read_value() for p in powers)
        return {
            "powers": powers,
            "lr": _f(adam["lr"]) * tf.sqrt(1.0 - beta2_power) / (1.0 - beta1_power),
            "beta1": _f(adam["beta1"]),
            "beta2": _f(adam["beta2"]),
            "epsilon": _f(adam["epsilon"]),
        }

    def _keras_params(self):
        """Hyperparameters of a Keras optimizer (both families) at its current iteration."""
        o = self.optimizer
        if self.family == "legacy":
            lr = private_call(o, "_decayed_lr", tf.float32)

            def get(name):
                return private_call(o, "_get_hyper", name, tf.float32)

            shrinkage = private_state(o, "_l2_shrinkage_regularization_strength", 0.0)
        else:
            private_call(o, "_compute_current_learning_rate")
            lr = tf.cast(o.learning_rate, tf.float32)

            def get(name):
                return tf.cast(getattr(o, name), tf.float32)

            shrinkage = getattr(o, "l2_shrinkage_regularization_strength", 0.0)
        p = {"lr": lr}
        if self.kind == "adam":
            step = tf.cast(o.iterations + 1, tf.float32)
            beta1, beta2 = get("beta_1"), get("beta_2")
            p.update(
                lr=lr * tf.sqrt(1.0 - tf.pow(beta2, step)) / (1.0 - tf.pow(beta1, step)),
                beta1=beta1,
                beta2=beta2,
                epsilon=_f(o.epsilon),
            )
        elif self.kind == "adagrad":
            p.update(epsilon=float(o.epsilon))
        elif self.kind == "momentum":
            p.update(momentum=get("momentum"), nesterov=bool(o.nesterov))
        elif self.kind == "ftrl":
            p.update(
                lr_power=get("learning_rate_power"),
                l1=get("l1_regularization_strength"),
                l2=get("l2_regularization_strength"),
                beta=get("beta"),
                l2_shrinkage=_f(shrinkage),
            )
        return p

    # --- the update ---
    def apply(self, triples):
        """Update op(s) of [(table, unique addresses, gradient rows)]."""
        if self.kind == "generic" and self.family == "v1":
            private_call(self.optimizer, "_prepare")
        params = {}
        if self.kind != "generic":
            params = self._v1_params() if self.family == "v1" else self._keras_params()
        if self.kind == "generic" and self.family != "v1":
            return self._keras_generic(triples)
        updates = []
        for table, addresses, rows in triples:
            with tf.name_scope(table_ops.op_scope_name(table.table_name)):
                updates.append(self._apply(table, addresses, rows, params))
        if "powers" not in params:
            return updates
        with tf.control_dependencies(updates):
            return [
                power.assign(power * params[beta])
                for power, beta in zip(params["powers"], ("beta1", "beta2"))
            ]

    def generic_slots(self, optimizer):
        """[(slot name, initial value)] of a generic Keras optimizer (built once to see)."""
        if self._keras_slots is None:
            self._keras_slots = KerasRows(
                optimizer, self.family, 1, "%s_de_probe" % self._name
            ).slot_info()
        return self._keras_slots

    def _locals(self, table, slot_names):
        """The resource variables the v1 generic path runs the optimizer's kernel on: one for
        the rows of a step and one per slot, registered as the optimizer's slots of the first
        (per graph and table)."""
        key = (_outer_graph(), table.table_name)
        if key not in self._generic_locals:
            with (
                tf.init_scope(),
                tf.compat.v1.variable_scope(
                    None,
                    default_name=table_ops.op_scope_name(table.table_name)
                    + "_"
                    + self._name
                    + "_rows",
                ),
            ):
                rows = row_variable(table.dim, "rows")
                slots = [row_variable(table.dim, name) for name in slot_names]
            for name, slot in zip(slot_names, slots):
                slot_dict = private_state(self.optimizer, "_slots").setdefault(name, {})
                slot_dict[tf_patches.var_key(rows)] = slot
            self._generic_locals[key] = (rows, slots)
        return self._generic_locals[key]

    def _keras_generic(self, triples):
        """The generic path of a Keras optimizer: per table a private copy (see KerasRows)
        at the wrapped optimizer's iteration and hyperparameters; the copies' optimizer-wide
        state (Nadam's momentum cache) is one, kept in the first copy made in this program,
        loaded into every copy of the step before any update and taken back from the first
        one after the step, so that it advances once per step as with dense variables."""
        graph = _outer_graph()
        copies = []
        for table, _, _ in triples:
            key = (graph, table.table_name)
            if key not in self._generic_locals:
                self._generic_locals[key] = KerasRows(
                    self.optimizer,
                    self.family,
                    table.dim,
                    "%s_%s_rows" % (table_ops.op_scope_name(table.table_name), self._name),
                )
            copies.append(self._generic_locals[key])
        shared = self._shared_state.setdefault(graph, copies[0])
        start = [v.read_value() for v in shared.state()]
        updates = []
        for (table, addresses, grads), copy in zip(triples, copies):
            with (
                tf.control_dependencies(start),
                tf.name_scope(table_ops.op_scope_name(table.table_name)),
            ):
                loads = copy.sync(self.optimizer) + [
                    v.assign(value, read_value=False)
                    for v, value in zip(copy.state(), start)
                    if copy is not shared
                ]
                updates.append(
                    copy.apply(
                        table, addresses, grads, "Keras" + type(self.optimizer).__name__, loads
                    )
                )
        if copies[0] is shared:
            return updates
        with tf.control_dependencies(updates):
            return updates + [
                v.assign(new.read_value(), read_value=False)
                for v, new in zip(shared.state(), copies[0].state())
            ]

    def _apply_generic(self, table, addresses, grads):
        slots, kernel = slot_info(self.optimizer)
        rows, slot_vars = self._locals(table, [name for name, _ in slots])
        return through_variables(
            table,
            addresses,
            kernel,
            [value for _, value in slots],
            rows,
            slot_vars,
            lambda: private_call(self.optimizer, "_resource_apply_dense", grads, rows),
        )

    def _apply(self, table, addresses, grads, p):
        if self.kind == "generic":
            return self._apply_generic(table, addresses, grads)
        keras = self.family != "v1"
        if self.kind == "adam":
            return optimizer_ops.apply_lazy_adam(
                table.handle,
                addresses,
                grads,
                p["lr"],
                p["beta1"],
                p["beta2"],
                p["epsilon"],
                tf.constant(1, tf.int64),
                unique_addresses=True,
                bias_corrected=True,
            )
        if self.kind == "adagrad":
            return optimizer_ops.apply_adagrad(
                table.handle,
                addresses,
                grads,
                p["lr"],
                initial_accumulator(self.optimizer),
                unique_addresses=True,
                epsilon=p["epsilon"],
                epsilon_inside_sqrt=self.family == "keras",
            )
        if self.kind == "rowwise_adagrad":
            return optimizer_ops.apply_rowwise_adagrad(
                table.handle,
                addresses,
                grads,
                p["lr"],
                initial_accumulator(self.optimizer),
                p["epsilon"],
                unique_addresses=True,
            )
        if self.kind == "momentum":
            return optimizer_ops.apply_momentum(
                table.handle,
                addresses,
                grads,
                p["lr"],
                p["momentum"],
                use_nesterov=p["nesterov"],
                unique_addresses=True,
                velocity=keras,
            )
        if self.kind == "ftrl":
            return optimizer_ops.apply_ftrl(
                table.handle,
                addresses,
                grads,
                p["lr"],
                p["lr_power"],
                p["l1"],
                p["l2"] + p["beta"] / (2.0 * p["lr"]),
                p["l2_shrinkage"],
                initial_accumulator(self.optimizer),
                unique_addresses=True,
            )
        return optimizer_ops.apply_gradient_descent(
            table.handle, addresses, grads, p["lr"], 0.0, unique_addresses=True
        )


# The hyperparameters each fused kernel takes from a tf.compat.v1.train optimizer, and the
# private attributes they are kept in: {kind: ((parameter, attribute), ...)} (see
# optimizer_kinds.private_state; "sgd" also stands for the kinds that take only a rate).
_V1_PARAMS = {
    "sgd": (("lr", "_learning_rate"),),
    "adagrad": (("lr", "_learning_rate"),),
    "rowwise_adagrad": (("lr", "_learning_rate"), ("epsilon", "_epsilon")),
    "momentum": (
        ("lr", "_learning_rate"),
        ("momentum", "_momentum"),
        ("nesterov", "_use_nesterov"),
    ),
    "ftrl": (
        ("lr", "_learning_rate"),
        ("lr_power", "_learning_rate_power"),
        ("l1", "_l1_regularization_strength"),
        ("l2", "_l2_regularization_strength"),
        ("l2_shrinkage", "_l2_shrinkage_regularization_strength"),
    ),
    "adam": (("lr", "_lr"), ("beta1", "_beta1"), ("beta2", "_beta2"), ("epsilon", "_epsilon")),
}
# Parameters the kernels take as attributes (the others: float32 tensors, see _f).
_ATTR_TYPES = {"epsilon": float, "nesterov": bool}


def _f(value):
    return tf.cast(hyper(value), tf.float32)
