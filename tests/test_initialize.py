"""Tests for rec_sdk.util.initialize: init's validation and the configuration's life cycle."""

import pytest
import tensorflow as tf

from rec_sdk.core.embedding import create_table
from rec_sdk.util import initialize
from rec_sdk.util.initialize import init, terminate_config_initializer

STEP_PARAMS = ("max_steps", "train_steps", "eval_steps", "save_steps")


@pytest.mark.parametrize("param", STEP_PARAMS)
@pytest.mark.parametrize("value", [-2, 2**31])
def test_step_out_of_range_rejected(param, value):
    with pytest.raises(ValueError, match=param):
        init(**{param: value})
    assert not initialize.is_initialized()


@pytest.mark.parametrize("param", STEP_PARAMS)
@pytest.mark.parametrize("value", [True, False, 1.0, 3.5])
def test_step_wrong_type_rejected(param, value):
    with pytest.raises(TypeError, match=param):
        init(**{param: value})
    assert not initialize.is_initialized()


@pytest.mark.parametrize("param", STEP_PARAMS)
@pytest.mark.parametrize("value", [-1, 0, 2**31 - 1])
def test_step_bounds_accepted(param, value):
    init(**{param: value})
    assert getattr(initialize, "get_" + param)() == value


def test_all_of_max_train_eval_zero_rejected():
    with pytest.raises(ValueError, match="max_steps.*train_steps.*eval_steps"):
        init(max_steps=0, train_steps=0, eval_steps=0)
    assert not initialize.is_initialized()
    # Any one of them non-zero is fine.
    init(max_steps=0, train_steps=0, eval_steps=1)
    assert initialize.get_eval_steps() == 1


@pytest.mark.parametrize("param", ["use_dynamic", "use_dynamic_expansion"])
@pytest.mark.parametrize("value", [1, 0, "True", None])
def test_bool_flags_type_checked(param, value):
    with pytest.raises(TypeError, match=param):
        init(**{param: value})
    assert not initialize.is_initialized()


def test_second_init_raises_and_keeps_first_config():
    init(train_steps=5, use_dynamic_expansion=True)
    with pytest.raises(RuntimeError, match="already"):
        init(train_steps=7, use_dynamic_expansion=False)
    assert initialize.get_train_steps() == 5
    assert initialize.get_use_dynamic_expansion() is True


def test_terminate_then_init_again():
    init(use_dynamic_expansion=True)
    assert initialize.is_initialized()
    terminate_config_initializer()
    assert not initialize.is_initialized()
    with pytest.raises(RuntimeError, match="init"):
        initialize.get_config()
    init(use_dynamic_expansion=False, train_steps=3)
    assert initialize.get_use_dynamic_expansion() is False
    assert initialize.get_train_steps() == 3
    # terminate is idempotent
    terminate_config_initializer()
    terminate_config_initializer()
    assert not initialize.is_initialized()


def test_unknown_and_sdk_kwargs_ignored():
    init(if_load=False, bind_cpu=True, use_mpi=False, some_future_option=42)
    assert initialize.is_initialized()
    assert initialize.get_max_steps() == -1


@pytest.mark.parametrize("expansion", [True, False])
@pytest.mark.parametrize("dynamic", [True, False])
def test_getters(expansion, dynamic):
    init(
        max_steps=10,
        train_steps=4,
        eval_steps=2,
        save_steps=1,
        use_dynamic=dynamic,
        use_dynamic_expansion=expansion,
    )
    assert initialize.get_use_dynamic_expansion() is expansion
    assert initialize.get_use_dynamic() is dynamic
    assert initialize.get_rank_id() == 0
    assert initialize.get_rank_size() == 1
    assert (
        initialize.get_max_steps(),
        initialize.get_train_steps(),
        initialize.get_eval_steps(),
        initialize.get_save_steps(),
    ) == (10, 4, 2, 1)


def test_defaults():
    init()
    assert initialize.get_use_dynamic() is True
    assert initialize.get_use_dynamic_expansion() is False
    assert initialize.get_max_steps() == -1


@pytest.mark.parametrize(
    "getter",
    [
        "get_use_dynamic_expansion",
        "get_use_dynamic",
        "get_train_steps",
        "get_if_load",
        "get_host_pipeline_ops",
    ],
)
def test_getters_before_init_raise(getter):
    with pytest.raises(RuntimeError, match="not initialised"):
        getattr(initialize, getter)()


def test_create_table_before_init_raises():
    with pytest.raises(RuntimeError, match="init"):
        create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer())


def test_create_table_after_terminate_raises():
    init()
    create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer())
    terminate_config_initializer()
    with pytest.raises(RuntimeError, match="init"):
        create_table(tf.int64, 4, "t2", tf.compat.v1.zeros_initializer())
