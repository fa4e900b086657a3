"""Durable state: the only code that writes SQL. Imports no other layer of ov."""
