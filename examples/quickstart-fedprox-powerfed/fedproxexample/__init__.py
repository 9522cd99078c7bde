"""fedproxexample: A Flower / PyTorch app trained with FedProx."""
