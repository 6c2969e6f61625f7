"""FakeData: random images, each made from its own index (the same every run, whatever the global RNG)."""
import os

import torch


class FakeData(torch.utils.data.Dataset):
    def __init__(self, size=None, image_size=(3, 224, 224), num_classes=10, transform=None, random_offset=0):
        self.size = int(os.environ.get("FAKEDATA_SIZE", "1000")) if size is None else size
        self.image_size, self.num_classes, self.transform = image_size, num_classes, transform
        self.random_offset = random_offset

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index + self.random_offset)
        img = torch.rand(*self.image_size, generator=g)
        target = int(torch.randint(0, self.num_classes, (1,), generator=g))
        return (self.transform(img) if self.transform else img), target
