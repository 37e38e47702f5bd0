"""ddpviz engine: DP, DDP and single-device training with instrumentation.

`engine.config` imports no torch; everything else does. Events leave through `engine.events` sinks.
"""
