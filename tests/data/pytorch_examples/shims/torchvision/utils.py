"""save_image: the image batch saved as a tensor file (torch.save), at the path given."""
import torch


def save_image(tensor, fp, normalize=False, **kw):
    torch.save(tensor.detach().cpu().clone(), fp)
