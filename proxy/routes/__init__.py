"""Thin HTTP handlers: parse, call the decision service or relay, render."""
