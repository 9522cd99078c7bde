"""pytorchexample: A Flower / PyTorch app."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 4


class Net(nn.Module):
    """Model (a small CNN for 1-channel 16x16 images)"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, NUM_CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def make_dataset(num_samples=2000, seed=0):
    """Four classes, each a fixed 16x16 pattern under noise; `seed` draws the samples."""
    patterns = torch.randn(NUM_CLASSES, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (num_samples,), generator=g)
    images = 1.0 * patterns[labels] + torch.randn(num_samples, 1, 16, 16, generator=g)
    return images, labels


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """Load this partition's share of the data: 80% train, 20% test."""
    images, labels = make_dataset()
    images, labels = images[partition_id::num_partitions], labels[partition_id::num_partitions]
    split = int(0.8 * len(labels))
    trainset = TensorDataset(images[:split], labels[:split])
    testset = TensorDataset(images[split:], labels[split:])
    trainloader = DataLoader(trainset, batch_size=batch_size, shuffle=True)
    testloader = DataLoader(testset, batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    """Load a held-out test set for the server (its own seed: none of the nodes' samples)."""
    images, labels = make_dataset(num_samples=500, seed=1)
    return DataLoader(TensorDataset(images, labels), batch_size=64)


def make_step(net, lr=0.01):
    """One training step of `net`: forward, loss, backward, optimizer step."""
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)

    def step(images, labels):
        optimizer.zero_grad()
        loss = criterion(net(images), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)
    net.train()
    step = make_step(net, lr)
    running_loss, steps = 0.0, 0
    for _ in range(epochs):
        for images, labels in trainloader:
            running_loss += step(images.to(device), labels.to(device))
            steps += 1
    return running_loss / max(steps, 1)  # local-epochs=0: no step, no division by zero


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    net.eval()
    criterion = nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(device))
            labels = labels.to(device)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(1) == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy
