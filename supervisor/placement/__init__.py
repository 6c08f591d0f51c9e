"""Placement: the pure planner that turns a config and placement options into a Plan, and its rules."""
