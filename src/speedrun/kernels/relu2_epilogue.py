"""What the ReLU² products' epilogues do, shared by the Triton (relu2_mlp.py) and Gluon (relu2_gluon.py)
kernels, so that neither imports the other for four constants.

STORE_H_AND_A: the forward stores h and a = relu(h)²; DRELU2: the backward multiplies by 2·relu(h);
STORE_A: the forward stores a alone; DRELU2_FROM_A: the backward recovers relu(h) = sqrt(a).
"""

STORE_H_AND_A, DRELU2, STORE_A, DRELU2_FROM_A = 0, 1, 2, 3
