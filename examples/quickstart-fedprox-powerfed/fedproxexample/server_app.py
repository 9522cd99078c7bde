"""fedproxexample: A Flower / PyTorch app trained with FedProx."""

from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedProx

from fedproxexample.task import Net, load_centralized_dataset, make_step, test
from powerfed import PowerAware, TrainInstructions, UserFunctions, estimate_relation, save_results

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

    # Initialize FedProx strategy (it sends proximal-mu to the clients)
    # power-aware: samples to target per batch size with this app's own step (SGD, proximal term)
    mu = context.run_config["proximal-mu"]
    proxy, own_step = load_centralized_dataset(), lambda m: make_step(m, lr, mu)
    rel = estimate_relation(
        Net, proxy=proxy, target_accuracy=0.8, batch_sizes=[8, 16, 32], user=UserFunctions(make_step=own_step)
    )
    plan = TrainInstructions.for_relation(rel, num_classes=4)
    strategy = PowerAware(FedProx(fraction_train=fraction_train, proximal_mu=mu), plan)

    # Start strategy, run FedProx for `num_rounds`
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
