"""What an operator sees of a running job, made from what the driver already knows.

Workers' progress from their heartbeats (`progress.py`: steps, samples, commit ages, the
collective each is in), stalls (`stalls.py`: ranks of one round that wait in a collective for
others that are not in it), the rounds timeline with each re-form's cause and recovery time
(`timeline.py`), the driver's own event-loop lag (`loop_lag.py`), and the Prometheus metrics
built from them at scrape time (`prometheus.py`). None of it decides anything.
"""
