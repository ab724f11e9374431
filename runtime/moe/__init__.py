"""MoE layer pieces: router, experts, dispatch and the exchanges behind it."""
