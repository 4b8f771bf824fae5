"""The checks that palt.PALT runs on its configuration before it builds anything."""
from support.errors import ConfigError


def check_config(cfg, n_layers: int, methods: tuple[str, ...]) -> None:
    """A palt.PaltConfig's parts against its method and a model of `n_layers` layers: a
    ConfigError in one line for what cannot work."""
    if cfg.method not in methods:
        raise ConfigError(f"method must be one of {', '.join(methods)}, not {cfg.method!r}")
    if cfg.head_input not in ("cls", "mean"):
        raise ConfigError(f"head_input must be cls or mean, not {cfg.head_input!r}")
    if cfg.method != "palt" and (cfg.calib_layers or cfg.prompt_encoder):
        raise ConfigError(f"PaltConfig(method={cfg.method!r}) has no calibration or W_p: give it "
                          "calib_layers=() and prompt_encoder=False")
    if cfg.method not in ("palt", "prompt") and (sum(cfg.prompts) or cfg.prompt_mlp):
        raise ConfigError(f"PaltConfig(method={cfg.method!r}) has no prompt tokens: give it "
                          "prompts=(0, 0, 0) and no prompt_mlp")
    if cfg.method == "prompt" and not sum(cfg.prompts):
        raise ConfigError("PaltConfig(method='prompt') trains prompt tokens: give it some")
    if cfg.method == "lora" and (cfg.lora_rank < 1 or cfg.lora_alpha <= 0):
        raise ConfigError(f"LoRA needs a rank of at least 1 and alpha above 0, not "
                          f"{cfg.lora_rank} and {cfg.lora_alpha}")
    if any(not 0 <= i < n_layers for i in cfg.calib_layers or ()):
        raise ConfigError(f"calibration layers {cfg.calib_layers} outside 0..{n_layers - 1}")
