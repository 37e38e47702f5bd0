"""Pieces every training mode shares.

    training    loss, optimizer, evaluation, parameter checksums, CPU threads per device/rank
    loop        the step loop: stop checks, step events, evaluation, memory samples
    preflight   checks on the model and data before any rank process starts
    devices     which devices a run uses (`DevicePlan`), checked before any process starts
    faults      fault injection: one rank or device thread fails (or diverges) at a chosen step
    lifetime    a process that dies with its parent (prctl PR_SET_PDEATHSIG): fork server, ranks, work-horse
    ports       free TCP ports for rendezvous stores and servers, drawn below the ephemeral range (no torch)
"""
