"""The loop's idleness as the device search worker reads it, from another thread."""

from __future__ import annotations

import asyncio
import threading
import time

from scheduler.control.loopwatch import busy_probe, new_event_loop


def test_the_probe_says_busy_only_while_the_loop_is_out_of_select() -> None:
    seen: dict[str, bool] = {}

    async def main() -> None:
        probe = busy_probe(asyncio.get_running_loop())

        def look(label: str, after: float) -> threading.Thread:
            def run() -> None:
                time.sleep(after)
                seen[label] = probe()

            t = threading.Thread(target=run)
            t.start()
            return t

        idle = look("idle", 0.05)
        await asyncio.sleep(0.3)  # waiting in select(): idle
        idle.join()
        busy = look("busy", 0.05)
        time.sleep(0.3)  # noqa: ASYNC251 -- holding the loop on purpose (GIL released: the thread looks)
        busy.join()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())
    assert seen == {"idle": False, "busy": True}


def test_a_loop_it_did_not_make_is_never_called_busy() -> None:
    async def main() -> bool:
        return busy_probe(asyncio.get_running_loop())()

    assert asyncio.run(main()) is False
