"""Settings: the defaults and their ranges, the config fields a Qwen checkpoint may carry, the gates and the
variant registry. Reads nothing from disk but the config.
"""
