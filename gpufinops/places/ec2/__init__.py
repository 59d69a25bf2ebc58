"""AWS EC2 as a place: `cloud` (Ec2Cloud: GPU instances listed and described per region with boto3, their tags,
stop and terminate, each mutating call sent once and read back; the on-demand price of each type), `accounts`
(several AWS accounts, a role assumed in each: MultiAccountCloud routes a change to the account that listed the
instance; `build_cloud` picks one or several from the settings).

May import: model, config, prices, collect.aws_config, places.fleet (RoutedCloud). Never imports kubernetes or
anything above places.
"""
