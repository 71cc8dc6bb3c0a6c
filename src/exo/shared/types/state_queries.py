"""Questions every part asks of the state, answered once: which instances a model has,
which of them serves, which task a command became, how busy an instance is.

Pure: a state in, values out."""

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import CommandId
from exo.shared.types.state import State
from exo.shared.types.tasks import TextGeneration
from exo.shared.types.worker.instances import Instance, InstanceId, instance_is_serving
from exo.shared.types.worker.runners import RunnerId


def instances_of(state: State, model_id: ModelId) -> list[Instance]:
    """The instances of a model, serving or not."""
    return [i for i in state.instances.values() if i.shard_assignments.model_id == model_id]


def serving_instances(state: State, model_id: ModelId) -> list[Instance]:
    """The instances of a model whose runners are all ready (or running)."""
    return [i for i in instances_of(state, model_id) if instance_is_serving(i, state.runners)]


def serving_instance(state: State, model_id: ModelId) -> Instance | None:
    """One serving instance of a model (None: none serves)."""
    serving = serving_instances(state, model_id)
    return serving[0] if serving else None


def task_of_command(state: State, command_id: CommandId) -> TextGeneration | None:
    """The generation task a command became (None: none, or no longer)."""
    for task in state.tasks.values():
        if isinstance(task, TextGeneration) and task.command_id == command_id:
            return task
    return None


def instance_of_runner(state: State, runner_id: RunnerId) -> Instance | None:
    """The instance a runner belongs to (None: no instance has it)."""
    for instance in state.instances.values():
        if runner_id in instance.shard_assignments.runner_to_shard:
            return instance
    return None


def task_load(state: State, instance_id: InstanceId) -> int:
    """How many tasks an instance holds."""
    return sum(1 for task in state.tasks.values() if task.instance_id == instance_id)


def least_loaded(state: State, instances: list[Instance]) -> Instance | None:
    """The instance with the fewest tasks (ties: the smallest id); None for none."""
    return min(instances, key=lambda i: (task_load(state, i.instance_id), i.instance_id),
               default=None)


def card_in_state(state: State, model_id: ModelId) -> ModelCard | None:
    """The card an instance of the model already carries (None: no instance has it)."""
    instances = instances_of(state, model_id)
    return instances[0].model_card if instances else None
