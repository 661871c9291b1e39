"""Single-device model definitions, shape rules and exact parameter/FLOP accounting.

Knows nothing about process groups, Ray or files. Modules (import them directly; this package
imports nothing, so `scalelab.models.config` stays cheap to import):

    config      ModelConfig (+ validate)
    llama       Transformer, build_model(cfg, device, seed)
    parametrization  sp | mup | completep: init std, forward multipliers, per-parameter LR scale
    loss        lm_loss(model, tokens, targets, z_loss) -> (loss, metrics)
    shapes      shape_for_params(target_params, vocab_size, ...) -> ModelConfig
    presets     get_preset(name, vocab_size=None, **overrides), list_presets()
    accounting  num_params, num_params_nonembedding, flops_per_token, model_summary
    hf_llama    to_hf_config, to_hf_state_dict, from_hf_state_dict, to_hf_model
"""
