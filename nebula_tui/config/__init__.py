"""``nodes.yaml``, read and typed: ``cluster.py`` (the file, its cluster, node and pool
sections) and ``settings.py`` (its scheduler, health, limits, accounting and notify
sections)."""

from .cluster import (CONFIG_ENV, SUBMITTER, SYSTEM_CONFIG, ClusterConfig, ConfigError, NodeConfig,
                      PoolConfig, did_you_mean, empty_config, find_config, load_config, parse_config)

__all__ = ["CONFIG_ENV", "SUBMITTER", "SYSTEM_CONFIG", "ClusterConfig", "ConfigError", "NodeConfig",
           "PoolConfig", "did_you_mean", "empty_config", "find_config", "load_config", "parse_config"]
