"""The scale-out predictor: DP and DDP at world size n, calibrated on measured runs. No torch.

    scaleout     the predictor: `predict`, scenarios (`Scenario`)
    validation   predicted vs real runs: `validate`, which runs fed the fit (`in_sample`), `out_of_sample`
    step_models  the two step models: DDP's bucket pipeline and DP's hub
    inputs       what one measured run gives the predictor (`measure_run`)
    calibrate    calibration from a set's single-device baseline: contention κ, fixed share f
    presets      link and compute presets, each number with its basis and source
"""
