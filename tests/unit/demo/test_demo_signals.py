"""The demo's signal handling while it trains (the process-level test is
tests/integration/demo/test_demo_signals_integration.py): the handlers are set only in the main
thread and put back afterwards."""
import signal


def test_outside_the_main_thread_the_handlers_are_left_alone():
    import threading

    from vissl_swav_plugin.demo.training import _termination_raises

    seen = []

    def body():
        with _termination_raises():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [before] and signal.getsignal(signal.SIGTERM) == before
    with _termination_raises():
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before
