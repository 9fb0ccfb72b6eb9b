"""The CNN and vision-transformer archs of ``compiler.tools.archs``: ResNet-18, MobileNetV3,
EfficientNet-B0, ConvNeXt, RegNetY, ViT/DeiT, Swin, a U-Net and a YOLO-style detector head."""
from __future__ import annotations

from .common import LayerNorm2d, _arch, _images, _seed, nn, torch


# -- ResNet-18 (He et al. 2016; torchvision's BasicBlock network) --------------------------------

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet: 7x7/2 stem, max pool, four stages of BasicBlocks, global average pool."""

    def __init__(self, layers=(2, 2, 2, 2), width=16, num_classes=10):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


@_arch
def build_resnet18(batch=1):
    rng = _seed()
    return ResNet(), {"x": _images(rng, batch, 64)}, {"x": [0], "logits": [0]}


# -- MobileNetV3 (Howard et al. 2019) ------------------------------------------------------------

def _make_divisible(v, divisor=8, min_value=None):
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class SqueezeExcitation(nn.Module):
    """torchvision's SqueezeExcitation: avg pool, 1x1 conv, activation, 1x1 conv, scale activation."""

    def __init__(self, input_channels, squeeze_channels, activation=None, scale_activation=None):
        super().__init__()
        activation, scale_activation = activation or nn.ReLU, scale_activation or nn.Sigmoid
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


def conv_norm_act(cin, cout, k, stride=1, groups=1, act=...):
    """Conv (no bias), BatchNorm, activation (ReLU unless ``act`` says otherwise; None: none)."""
    if act is ...:
        act = nn.ReLU
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True) if act in (nn.ReLU, nn.Hardswish, nn.SiLU) else act())
    return nn.Sequential(*layers)


class MobileNetV3Block(nn.Module):
    def __init__(self, cin, k, exp, cout, use_se, act, stride):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        layers = []
        if exp != cin:
            layers.append(conv_norm_act(cin, exp, 1, act=act))
        layers.append(conv_norm_act(exp, exp, k, stride, groups=exp, act=act))
        if use_se:
            layers.append(SqueezeExcitation(exp, _make_divisible(exp // 4), scale_activation=nn.Hardsigmoid))
        layers.append(conv_norm_act(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


class MobileNetV3(nn.Module):
    """MobileNetV3-Small's layout, shortened: (kernel, expanded, out, SE, activation, stride) per block."""

    CONFIG = [(3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
              (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1)]

    def __init__(self, num_classes=10, last_channel=128):
        super().__init__()
        layers = [conv_norm_act(3, 16, 3, 2, act=nn.Hardswish)]
        cin = 16
        for k, exp, cout, se, act, s in self.CONFIG:
            layers.append(MobileNetV3Block(cin, k, exp, cout, se, nn.Hardswish if act == "HS" else nn.ReLU, s))
            cin = cout
        layers.append(conv_norm_act(cin, 6 * cin, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(6 * cin, last_channel), nn.Hardswish(inplace=True),
                                        nn.Dropout(p=0.2, inplace=True), nn.Linear(last_channel, num_classes))

    def forward(self, x):
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


@_arch
def build_mobilenetv3(batch=1):
    rng = _seed()
    return MobileNetV3(), {"x": _images(rng, batch, 64)}, {"x": [0], "logits": [0]}


# -- EfficientNet-B0 (Tan & Le 2019) -------------------------------------------------------------

class MBConv(nn.Module):
    def __init__(self, cin, cout, k, stride, expand_ratio):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        exp = _make_divisible(cin * expand_ratio)
        layers = []
        if exp != cin:
            layers.append(conv_norm_act(cin, exp, 1, act=nn.SiLU))
        layers.append(conv_norm_act(exp, exp, k, stride, groups=exp, act=nn.SiLU))
        layers.append(SqueezeExcitation(exp, max(1, cin // 4), activation=nn.SiLU))
        layers.append(conv_norm_act(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result += x  # stochastic depth is the identity in eval mode
        return result


class EfficientNet(nn.Module):
    """EfficientNet-B0's first stages (expand ratio, kernel, stride, in, out, repeats) and its head.

    ``ceil_pool=True`` pools with ``AvgPool2d(3, stride=3, ceil_mode=True)`` on the 2x2 final map
    instead of torchvision's adaptive pool, as a network written for a larger input does when run
    smaller: the window is larger than the input and averages the part inside it (ONNX AveragePool,
    ceil_mode=1, count_include_pad=0: one output per axis, ceil((2 - 3) / 3) + 1)."""

    CONFIG = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 1), (6, 3, 2, 40, 80, 2)]

    def __init__(self, num_classes=10, head=128, ceil_pool=False):
        super().__init__()
        layers = [conv_norm_act(3, 32, 3, 2, act=nn.SiLU)]
        for t, k, s, cin, cout, n in self.CONFIG:
            for i in range(n):
                layers.append(MBConv(cin if i == 0 else cout, cout, k, s if i == 0 else 1, t))
        layers.append(conv_norm_act(self.CONFIG[-1][4], head, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AvgPool2d(kernel_size=3, stride=3, ceil_mode=True) if ceil_pool else nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(p=0.2, inplace=True), nn.Linear(head, num_classes))

    def forward(self, x):
        x = torch.flatten(self.pool(self.features(x)), 1)
        return self.classifier(x)


@_arch
def build_efficientnet_b0(batch=1):
    rng = _seed()
    return EfficientNet(), {"x": _images(rng, batch, 32)}, {"x": [0], "logits": [0]}


@_arch
def build_efficientnet_b0_ceil_pool(batch=1):
    rng = _seed()
    return EfficientNet(ceil_pool=True), {"x": _images(rng, batch, 32)}, {"x": [0], "logits": [0]}


# -- ConvNeXt (Liu et al. 2022) ------------------------------------------------------------------
# (its channels-first LayerNorm2d is in common.py, with the other norm randomize_norms knows)

class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, then LayerNorm over channels (permuted to channels-last), Linear 4x, GELU,
    Linear, layer scale, permuted back, residual."""

    def __init__(self, dim, layer_scale_init_value=0.5):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale_init_value * torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, x):
        inp = x
        x = self.dwconv(x)
        x = x.permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        x = self.gamma * x
        x = x.permute(0, 3, 1, 2)
        return inp + x  # drop path is the identity in eval mode


class ConvNeXt(nn.Module):
    def __init__(self, depths=(2, 2), dims=(32, 64), num_classes=10):
        super().__init__()
        self.downsample_layers = nn.ModuleList()
        self.downsample_layers.append(nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0])))
        for i in range(len(dims) - 1):
            self.downsample_layers.append(nn.Sequential(LayerNorm2d(dims[i]), nn.Conv2d(dims[i], dims[i + 1], 2, 2)))
        self.stages = nn.ModuleList(nn.Sequential(*[ConvNeXtBlock(d) for _ in range(n)]) for d, n in zip(dims, depths))
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        for down, stage in zip(self.downsample_layers, self.stages):
            x = stage(down(x))
        return self.head(self.norm(x.mean([-2, -1])))


@_arch
def build_convnext(batch=1):
    rng = _seed()
    return ConvNeXt(), {"x": _images(rng, batch, 32)}, {"x": [0], "logits": [0]}


# -- RegNetY (Radosavovic et al. 2020) -----------------------------------------------------------

class RegNetYBlock(nn.Module):
    """RegNet's Y block: 1x1, 3x3 group conv (the stride), squeeze-excite, 1x1, residual, ReLU."""

    def __init__(self, cin, cout, stride, group_width=8, bottleneck=1.0, se_ratio=0.25):
        super().__init__()
        w_b = int(round(cout * bottleneck))
        self.a = conv_norm_act(cin, w_b, 1)
        self.b = conv_norm_act(w_b, w_b, 3, stride, groups=w_b // group_width)
        self.se = SqueezeExcitation(w_b, int(round(se_ratio * cin)))
        self.c = conv_norm_act(w_b, cout, 1, act=None)
        self.proj = conv_norm_act(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        sc = self.proj(x) if self.proj is not None else x
        return self.relu(sc + self.c(self.se(self.b(self.a(x)))))


class RegNet(nn.Module):
    def __init__(self, widths=(24, 56, 152), depths=(1, 2, 1), num_classes=10):
        super().__init__()
        self.stem = conv_norm_act(3, 32, 3, 2)
        blocks, cin = [], 32
        for w, d in zip(widths, depths):
            for i in range(d):
                blocks.append(RegNetYBlock(cin, w, 2 if i == 0 else 1))
                cin = w
        self.trunk_output = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.avgpool(self.trunk_output(self.stem(x)))
        return self.fc(x.flatten(start_dim=1))


@_arch
def build_regnet(batch=1):
    rng = _seed()
    return RegNet(), {"x": _images(rng, batch, 32)}, {"x": [0], "logits": [0]}


# -- ViT / DeiT-tiny (Dosovitskiy et al. 2021; Touvron et al. 2021) ------------------------------

class Attention(nn.Module):
    """timm's Attention: one qkv Linear, heads split by reshape/permute, scaled softmax."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ViTBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, torch_mha=False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.torch_mha = torch_mha
        self.attn = nn.MultiheadAttention(dim, num_heads, batch_first=True) if torch_mha else Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        y = self.norm1(x)
        if self.torch_mha:
            y = self.attn(y, y, y, need_weights=False)[0]
        else:
            y = self.attn(y)
        x = x + y
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """Patch embedding conv, class token, learned position embedding, pre-norm blocks (the first
    with timm's hand-written attention, the second with ``nn.MultiheadAttention``), class-token head."""

    def __init__(self, img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4, num_classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, embed_dim, patch_size, patch_size)
        num_patches = (img_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, embed_dim) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(embed_dim, num_heads, torch_mha=i % 2 == 1) for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, N, C)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


@_arch
def build_vit(batch=1):
    rng = _seed()
    return VisionTransformer(), {"x": _images(rng, batch, 32)}, {"x": [0], "logits": [0]}


# -- Swin Transformer (Liu et al. 2021) ----------------------------------------------------------

def window_partition(x, window_size):
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows, window_size, H, W):
    C = windows.shape[-1]
    x = windows.view(-1, H // window_size, W // window_size, window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


class WindowAttention(nn.Module):
    """Swin's window attention with the relative position bias gathered from its table."""

    def __init__(self, dim, window_size, num_heads):
        super().__init__()
        self.window_size, self.num_heads = window_size, num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.randn((2 * window_size - 1) ** 2, num_heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size), indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = (coords_flatten[:, :, None] - coords_flatten[:, None, :]).permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += window_size - 1
        relative_coords[:, :, 1] += window_size - 1
        relative_coords[:, :, 0] *= 2 * window_size - 1
        self.register_buffer("relative_position_index", relative_coords.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj(x)


class SwinBlock(nn.Module):
    def __init__(self, dim, resolution, num_heads, window_size, shift_size):
        super().__init__()
        self.resolution, self.window_size, self.shift_size = resolution, window_size, shift_size
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window_size, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, 4 * dim)
        if shift_size > 0:  # the shifted windows' mask, as Swin computes it
            H = W = resolution
            img_mask = torch.zeros((1, H, W, 1))
            cnt = 0
            for h in (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None)):
                for w in (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None)):
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mask_windows = window_partition(img_mask, window_size).view(-1, window_size * window_size)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
        else:
            attn_mask = None
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x):
        H = W = self.resolution
        B, L, C = x.shape
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift_size > 0:
            x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
        x_windows = window_partition(x, self.window_size).view(-1, self.window_size * self.window_size, C)
        attn_windows = self.attn(x_windows, mask=self.attn_mask)
        attn_windows = attn_windows.view(-1, self.window_size, self.window_size, C)
        x = window_reverse(attn_windows, self.window_size, H, W)
        if self.shift_size > 0:
            x = torch.roll(x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        x = shortcut + x.view(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class SwinTransformer(nn.Module):
    """Patch embedding (4x4 conv + LayerNorm), a W-MSA block and an SW-MSA block (cyclic shift with
    ``torch.roll`` and the shift mask), patch merging, final norm, mean pool, head."""

    def __init__(self, img_size=32, patch_size=4, embed_dim=32, num_heads=2, window_size=4, num_classes=10):
        super().__init__()
        res = img_size // patch_size
        self.patch_embed = nn.Conv2d(3, embed_dim, patch_size, patch_size)
        self.patch_norm = nn.LayerNorm(embed_dim)
        self.blocks = nn.Sequential(SwinBlock(embed_dim, res, num_heads, window_size, 0),
                                    SwinBlock(embed_dim, res, num_heads, window_size, window_size // 2))
        self.res = res
        self.merge_norm = nn.LayerNorm(4 * embed_dim)
        self.reduction = nn.Linear(4 * embed_dim, 2 * embed_dim, bias=False)
        self.norm = nn.LayerNorm(2 * embed_dim)
        self.head = nn.Linear(2 * embed_dim, num_classes)

    def forward(self, x):
        x = self.patch_norm(self.patch_embed(x).flatten(2).transpose(1, 2))
        x = self.blocks(x)
        B, L, C = x.shape
        x = x.view(B, self.res, self.res, C)  # patch merging
        x = torch.cat([x[:, 0::2, 0::2, :], x[:, 1::2, 0::2, :], x[:, 0::2, 1::2, :], x[:, 1::2, 1::2, :]], -1)
        x = self.reduction(self.merge_norm(x.view(B, -1, 4 * C)))
        return self.head(self.norm(x).mean(dim=1))


@_arch
def build_swin(batch=1):
    rng = _seed()
    return SwinTransformer(), {"x": _images(rng, batch, 32)}, {"x": [0], "logits": [0]}


# -- U-Net (Ronneberger et al. 2015) -------------------------------------------------------------

class DoubleConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.double_conv = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                         nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.double_conv(x)


class Up(nn.Module):
    """Up-sampling (``ConvTranspose2d`` or ``nn.Upsample`` bilinear + 1x1), the skip concatenated."""

    def __init__(self, cin, cout, mode):
        super().__init__()
        if mode == "transpose":
            self.up = nn.ConvTranspose2d(cin, cin // 2, kernel_size=2, stride=2)
        else:
            self.up = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=mode == "align"),
                                    nn.Conv2d(cin, cin // 2, 1))
        self.conv = DoubleConv(cin, cout)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels=3, n_classes=2, base=8):
        super().__init__()
        self.inc = DoubleConv(n_channels, base)
        self.down1 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(base, base * 2))
        self.down2 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(base * 2, base * 4))
        self.down3 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(base * 4, base * 8))
        self.up1 = Up(base * 8, base * 4, "transpose")
        self.up2 = Up(base * 4, base * 2, "bilinear")
        self.up3 = Up(base * 2, base, "align")
        self.outc = nn.Conv2d(base, n_classes, kernel_size=1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x = self.up1(x4, x3)
        x = self.up2(x, x2)
        x = self.up3(x, x1)
        return self.outc(x)


@_arch
def build_unet(batch=1):
    rng = _seed()
    return UNet(), {"x": _images(rng, batch, 32)}, {"x": [0], "mask": [0]}


# -- YOLO-style detector (YOLOv5's Detect head) --------------------------------------------------

class ConvBNSiLU(nn.Module):
    def __init__(self, cin, cout, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class C3(nn.Module):
    """YOLOv5's CSP block: two 1x1 branches, bottlenecks on one, concatenated, 1x1."""

    def __init__(self, cin, cout):
        super().__init__()
        c_ = cout // 2
        self.cv1, self.cv2, self.cv3 = ConvBNSiLU(cin, c_), ConvBNSiLU(cin, c_), ConvBNSiLU(2 * c_, cout)
        self.m = nn.Sequential(ConvBNSiLU(c_, c_), ConvBNSiLU(c_, c_, 3))

    def forward(self, x):
        a = self.cv1(x)
        return self.cv3(torch.cat((a + self.m(a), self.cv2(x)), 1))


class Detect(nn.Module):
    """YOLOv5's inference head: per level a 1x1 conv to anchors x (5 + classes), view/permute to
    (b, anchors, y, x, outputs), sigmoid, split into xy/wh/conf, decoded against the grid and
    anchors, concatenated over levels."""

    def __init__(self, nc, anchors, ch, strides):
        super().__init__()
        self.nc, self.no = nc, nc + 5
        self.nl, self.na = len(anchors), len(anchors[0]) // 2
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)
        self.stride = strides
        self.register_buffer("anchors", torch.tensor(anchors).float().view(self.nl, -1, 2))

    def _make_grid(self, nx, ny, i):
        yv, xv = torch.meshgrid(torch.arange(ny).float(), torch.arange(nx).float(), indexing="ij")
        grid = torch.stack((xv, yv), 2).expand((1, self.na, ny, nx, 2)) - 0.5
        anchor_grid = self.anchors[i].view((1, self.na, 1, 1, 2)).expand((1, self.na, ny, nx, 2))
        return grid, anchor_grid

    def forward(self, xs):
        z = []
        for i in range(self.nl):
            x = self.m[i](xs[i])
            bs, _, ny, nx = x.shape
            x = x.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            grid, anchor_grid = self._make_grid(nx, ny, i)
            xy, wh, conf = x.sigmoid().split((2, 2, self.nc + 1), 4)
            xy = (xy * 2 + grid) * self.stride[i]
            wh = (wh * 2) ** 2 * anchor_grid
            z.append(torch.cat((xy, wh, conf), 4).view(bs, self.na * nx * ny, self.no))
        return torch.cat(z, 1)


class YoloDetector(nn.Module):
    def __init__(self, nc=3):
        super().__init__()
        self.stem = nn.Sequential(ConvBNSiLU(3, 16, 3, 2), ConvBNSiLU(16, 32, 3, 2), C3(32, 32))
        self.p4 = nn.Sequential(ConvBNSiLU(32, 64, 3, 2), C3(64, 64))
        self.p5 = nn.Sequential(ConvBNSiLU(64, 64, 3, 2), C3(64, 64))
        self.detect = Detect(nc, ((10, 13, 16, 30, 33, 23), (30, 61, 62, 45, 59, 119), (116, 90, 156, 198, 373, 326)),
                             (32, 64, 64), (4, 8, 16))

    def forward(self, x):
        p3 = self.stem(x)
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        return self.detect([p3, p4, p5])


@_arch
def build_yolo(batch=1):
    rng = _seed()
    return YoloDetector(), {"x": _images(rng, batch, 64)}, {"x": [0], "detections": [0]}
