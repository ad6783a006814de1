"""One engine step and its parts, around one ``Step`` (``step.py``): the scheduler creates
it, the runner launches, samples and collects it, ``Scheduler.update`` consumes it; the
engine drives them (``engine.py``), and with async scheduling queues steps ahead
(``run_ahead.py``)."""
