"""pytorchexample: A Flower / PyTorch app."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from powerfed import PowerAware, TrainInstructions, estimate_relation, save_results
from pytorchexample.task import Net, load_data

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
    proxy, _ = load_data(0, 10, 32)
    rel = estimate_relation(Net, proxy=proxy, target_accuracy=0.8, batch_sizes=[8, 16, 32], cache_key="1")
    plan = TrainInstructions(
        model=rel.model, relation_vector=rel, target_accuracy=0.8, num_classes=4, model_overrides={}
    )
    strategy = PowerAware(FedAvg(fraction_train=fraction_train), plan)

    # Start strategy, run FedAvg for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
    )

    # Save final model to disk
    print("\nSaving final model to disk...")
    state_dict = result.arrays.to_torch_state_dict()
    torch.save(state_dict, context.run_config["model-path"])
    print(f"results: {save_results(strategy, context.run_config['results'])}")
