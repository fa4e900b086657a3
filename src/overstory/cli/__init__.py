"""Click commands only: parse, call one core function, render."""
