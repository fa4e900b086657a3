"""Operator commands over a whole project: init, doctor, demo, clean."""
