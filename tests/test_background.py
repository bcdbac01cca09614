import logging
import threading

import pytest

from cudnnnet.util.background import Background
from cudnnnet.errors import TrainingError


def test_the_result_is_the_value_computed_on_a_thread_of_that_name():
    running = Background("cudnnnet-doubling", lambda value: (value * 2, threading.current_thread().name), 21)
    value, thread = running.result()
    assert value == 42 and thread == "cudnnnet-doubling" != threading.current_thread().name


def test_the_result_raises_the_exception_of_the_function_in_the_caller():
    def failing():
        raise TrainingError("the data is broken")

    with pytest.raises(TrainingError, match="the data is broken"):
        Background("cudnnnet-failing", failing).result()


def test_join_waits_and_only_logs_an_exception_the_function_let_escape(caplog):
    finished = []

    def failing():
        finished.append(True)
        raise RuntimeError("a bug in the warm-up")

    Background("cudnnnet-warm-up", failing).join()
    assert finished == [True]
    assert "cudnnnet-warm-up failed on its thread" in caplog.text
    assert all(record.levelno == logging.WARNING for record in caplog.records)
