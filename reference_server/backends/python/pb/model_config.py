"""`pb_utils.ModelConfig`: the configuration a model's `auto_complete_config` receives and may
complete, with Triton's rules for what it may set."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ModelConfig"]


class ModelConfig:
    """The configuration `auto_complete_config` receives and may complete (Triton's rules)."""

    def __init__(self, model_config: str) -> None:
        self._config: dict[str, Any] = json.loads(model_config)
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def max_batch_size(self) -> int:
        return int(self._config.get("max_batch_size", 0))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if self._config["max_batch_size"] > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {self._config['max_batch_size']}, but in "
                f"auto-complete-config function for model '{self._config['name']}' specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but auto-complete-config "
                    f"function for model '{self._config['name']}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, tensor: dict[str, Any], valid: tuple[str, ...]) -> None:
        model = self._config["name"]
        for key in tensor:
            if key not in valid:
                allowed = ", ".join(f"'{v}'" for v in valid)
                raise ValueError(
                    f"{kind} '{tensor.get('name')}' in auto-complete-config function for model '{model}' "
                    f"contains property other than {allowed}."
                )
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{tensor.get('name', '')}' in auto-complete-config function for model '{model}' "
                    f"is missing '{key}' property."
                )
        for current in self._config[kind]:
            if current["name"] != tensor["name"]:
                continue
            declared = current.get("data_type", "TYPE_INVALID")
            if declared not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {declared} for {kind} "
                    f"'{tensor['name']}', model provides {tensor['data_type']}"
                )
            dims = [int(d) for d in current.get("dims", [])]
            if dims and dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{model}', tensor '{tensor['name']}': the model expects dims {list(tensor['dims'])} "
                    f"but the model configuration specifies dims {dims}"
                )
            current.update(tensor)
            return
        self._config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        model = self._config["name"]
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{model}' "
                    "contains property other than 'decoupled'."
                )
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{model}', "
                    f"which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
