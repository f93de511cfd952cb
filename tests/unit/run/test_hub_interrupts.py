"""A Ctrl-C that lands while gevent's hub runs is not printed by the hub (``runner._quiet_hub_interrupts``):
stderr held a bare "KeyboardInterrupt" and a time stamp before "oomload: interrupted"."""

from __future__ import annotations

import pytest


def test_the_hub_leaves_a_ctrl_c_unprinted_and_still_raises_it(capsys: pytest.CaptureFixture[str]) -> None:
    import gevent

    from oomload.run.runner import _quiet_hub_interrupts

    hub = gevent.get_hub()
    saved = hub.NOT_ERROR
    try:
        _quiet_hub_interrupts()
        _quiet_hub_interrupts()  # once is enough: the second call adds nothing
        assert (*saved, KeyboardInterrupt) == hub.NOT_ERROR
        assert issubclass(KeyboardInterrupt, hub.SYSTEM_ERROR)  # raised in the main greenlet still
        with pytest.raises(KeyboardInterrupt):
            hub.handle_error(None, KeyboardInterrupt, KeyboardInterrupt(), None)
        assert capsys.readouterr().err == ""
    finally:
        hub.NOT_ERROR = saved
