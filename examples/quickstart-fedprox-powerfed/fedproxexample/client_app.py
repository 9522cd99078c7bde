"""fedproxexample: A Flower / PyTorch app trained with FedProx."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedproxexample.task import Net, load_data, make_step
from fedproxexample.task import test as test_fn
from fedproxexample.task import train as train_fn
from powerfed import PowerSession, describe_node, power_aware_mod

# Flower ClientApp
app = ClientApp(mods=[power_aware_mod])
app.query()(describe_node)


@app.train()
def train(msg: Message, context: Context):
    """Train the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())

    # Load the data
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)
    example, num_examples = next(iter(trainloader)), len(trainloader.dataset)

    # Call the training function
    epochs, lr = context.run_config["local-epochs"], msg.content["config"]["lr"]
    mu = msg.content["config"]["proximal-mu"]  # FedProx sends it with every round
    own_step = lambda m: make_step(m, lr, mu)  # noqa: E731 (the step the session profiles and trains)
    with PowerSession(
        model=model, make_step=own_step, example=example, train_examples=num_examples, lr=lr
    ) as s:
        trainloader, valloader = load_data(partition_id, num_partitions, s.batch_size)
        train_loss = train_fn(model, trainloader, epochs, lr, mu, s.torch_device, s)
        s.evaluated(test_fn(model, valloader, s.torch_device)[1])

    # Construct and return reply Message
    model_record = ArrayRecord(model.state_dict())
    metrics = {
        "train_loss": train_loss,
        "num-examples": len(trainloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

    # Load the data
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    _, valloader = load_data(partition_id, num_partitions, batch_size)

    # Call the evaluation function
    eval_loss, eval_acc = test_fn(model, valloader, device)

    # Construct and return reply Message
    metrics = {
        "eval_loss": eval_loss,
        "eval_acc": eval_acc,
        "num-examples": len(valloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"metrics": metric_record})
    return Message(content=content, reply_to=msg)
