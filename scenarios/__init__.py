"""Fault scenarios: the real system as OS processes, crashed, starved and fed garbage, then
checked for lost notifications. ``python -m scenarios list | run NAME... | run all``."""
