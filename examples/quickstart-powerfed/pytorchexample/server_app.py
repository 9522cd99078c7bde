"""pytorchexample: A Flower / PyTorch app."""

from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from powerfed import PowerAware, RelationCompute, TrainInstructions, estimate_relation, save_results
from pytorchexample.task import Net, load_centralized_dataset, test

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    fraction_train: float = context.run_config["fraction-train"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["lr"]

    # Load global model
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize FedAvg strategy
    # power-aware: Net's samples to target per batch size on proxy data (cached), the plan it sends
    proxy, cached = load_centralized_dataset(), RelationCompute(cache_key="1")  # "1": Net's version
    rel = estimate_relation(Net, proxy=proxy, target_accuracy=0.8, batch_sizes=[8, 16, 32], how=cached)
    plan = TrainInstructions.for_relation(rel, num_classes=4)
    strategy = PowerAware(FedAvg(fraction_train=fraction_train), plan)

    # Start strategy, run FedAvg for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate,
    )

    # Save final model to disk
    print("\nSaving final model to disk...")
    state_dict = result.arrays.to_torch_state_dict()
    Path(context.run_config["model-path"]).parent.mkdir(parents=True, exist_ok=True)  # runs/: git ignores it
    torch.save(state_dict, context.run_config["model-path"])
    print(f"results: {save_results(strategy, context.run_config['results'])}")


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate model on central data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

    # Load entire test set
    test_dataloader = load_centralized_dataset()

    # Evaluate the global model on the test set
    test_loss, test_acc = test(model, test_dataloader, device)

    # Return the evaluation metrics
    return MetricRecord({"accuracy": test_acc, "loss": test_loss})
