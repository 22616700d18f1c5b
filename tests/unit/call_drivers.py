"""Running one sans-I/O wire call (rmq.client.calls) under both of its drivers, for the unit tests
of the calls: the blocking ``drive`` and the awaiting ``adrive`` must come to the same outcome."""
import asyncio

from rmq.client.calls import adrive, drive


def under_both_drivers(setup) -> list:
    """``setup()`` -> ``(call, invoke, state)``, made afresh for each driver (``invoke(addr, frame,
    timeout_ms)``: the blocking transport of the test, which answers or raises).  Returns
    ``[(outcome, state)]`` for ``drive`` and then ``adrive`` (with ``invoke`` awaited); the
    outcome is the call's result or the exception it raised."""
    runs = []
    for awaiting in (False, True):
        call, invoke, state = setup()

        async def ainvoke(addr, frame, timeout_ms, invoke=invoke):
            return invoke(addr, frame, timeout_ms)

        try:
            out = asyncio.run(adrive(call, ainvoke)) if awaiting else drive(call, invoke)
        except Exception as e:  # noqa: BLE001 - the tests compare it between the drivers
            out = e
        runs.append((out, state))
    return runs
